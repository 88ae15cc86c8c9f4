"""What the device programs' backends share (ExecuTorch's `.pte`, LiteRT's `.tflite`): each runs on the CPU alone
here (XNNPACK), reads the input contract the export wrote beside it, and is timed for that contract at one thread
and at every core."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

import torch

from runtime.base import ArtifactError, Backend, RunOptions
from runtime.timing import time_runs

LATENCY_WARMUP, LATENCY_RUNS = 3, 20  # batch-1 milliseconds, median of single calls


def contract_name(program_name: str, suffix: str, kind: str) -> str:
    """The input contract written beside a program: model.pte -> model.executorch.json (suffix ".pte")."""
    stem = program_name[:-len(suffix)] if program_name.endswith(suffix) else program_name
    return f"{stem}.{kind}.json"


def read_contract(path: Path, contract: str, options: RunOptions, what: str) -> dict[str, Any]:
    """The contract `contract` beside the program at `path`, once the device is known to be the CPU."""
    if options.torch_device.type != "cpu":
        raise ArtifactError(f"{what} run on the CPU here (XNNPACK), not {options.device}; serve another form on a "
                            "CUDA machine")
    beside = path.with_name(contract)
    if not beside.is_file():
        raise ArtifactError(f"{path.name}'s input contract {beside.name} is missing beside it; re-run the export")
    read: dict[str, Any] = json.loads(beside.read_text())
    return read


def batch1_latency(kind: str, path: Path, example: torch.Tensor) -> dict[str, float]:
    """Median batch-1 milliseconds through the kind's own runtime at one thread and at every core."""
    from runtime import open_artifact  # the registry imports this module's users
    results = {}
    for threads in dict.fromkeys((1, len(os.sched_getaffinity(0)))):
        backend = open_artifact(kind, path, RunOptions(threads=threads))

        def call(backend: Backend = backend) -> None:
            backend(example)
        results[f"threads_{threads}"] = round(statistics.median(
            time_runs(call, LATENCY_WARMUP, LATENCY_RUNS, min_seconds=0)), 3)
    return results
