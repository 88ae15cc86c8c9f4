"""EfficientNet-Lite0's fp32 ONNX (onnx-dynamo), OpenVINO IR and ExecuTorch programs, batch 1, taking turns, at 1
and 2 threads: median milliseconds of single calls through runtime/ (the backends the server runs).

    python docs/results/2026-11-28-executorch/compare.py ONNX_AND_OPENVINO_DIR EXECUTORCH_DIR
"""

import statistics
import sys
from pathlib import Path

import torch

from runtime import RunOptions, open_artifact
from runtime.timing import time_runs

FORMS = {"onnx-dynamo": ("onnx", 0, "model.dynamo.onnx"), "openvino": ("openvino", 0, "model.openvino.xml"),
         "executorch": ("executorch", 1, "model.pte"), "executorch-int8": ("executorch", 1, "model.int8.pte")}
ROUNDS, RUNS = 3, 30

folders = [Path(p) for p in sys.argv[1:3]]
example = torch.rand(1, 3, 224, 224)
print("| form | threads | ms, best round (each round's median) |\n|---|---|---|")
for threads in (1, 2):
    backends = {kind: open_artifact(fmt, folders[i] / name, RunOptions(threads=threads))
                for kind, (fmt, i, name) in FORMS.items() if (folders[i] / name).is_file()}
    rounds = {kind: [] for kind in backends}
    for _ in range(ROUNDS):
        for kind, backend in backends.items():
            rounds[kind].append(statistics.median(time_runs(lambda b=backend: b(example), 5, RUNS, min_seconds=0)))
    for kind, values in rounds.items():
        print(f"| {kind} | {threads} | {min(values):.2f} ({', '.join(f'{v:.2f}' for v in values)}) |")
