"""What a worker imports before its first answer (handlers/opening.py's path, every engine's): none of what serving
never needs (torchvision, whose ops import torch._dynamo and sympy; the onnx package; the export, its gates and the
measurements), and no runtime of a form it does not serve. Each check is a fresh interpreter that imports an
engine's modules as its worker does, then lists sys.modules, so that such an import cannot creep back unseen."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from runtime.base import BACKENDS
from tests.conftest import ROOT

CAT = ROOT / "examples" / "cat.jpg"
# imported by none of the engines' paths; each was on one before (torchvision: seconds of every worker's start)
NEVER_SERVED = ("torchvision", "torch._dynamo", "sympy", "onnx", "export", "gates", "measure")
# a format's runtime library, beyond its runtime/ module: not imported unless that format serves
FORMAT_LIBRARIES = {"onnx": ("onnxruntime",), "openvino": ("openvino",), "executorch": ("executorch",),
                    "aoti": ("torch._inductor",)}
TORCHSERVE_WORKER = ("handlers.torchserve_entry",)  # the archive's handler file, as TorchServe imports it
KSERVE_WORKER = ("serving.kserve.worker", "handlers.tasks")  # a spawned pool worker: its module, then open_core
KSERVE_SERVER = ("handlers.kserve_model",)  # the server process, which opens the model itself with one worker
RAY_REPLICA = ("serving.ray.deployment",)

OPEN_AND_ANSWER = """
import importlib, json, sys
from pathlib import Path
for name in sys.argv[1].split(","):
    importlib.import_module(name)
if len(sys.argv) > 2:
    from handlers.opening import open_archive
    core = open_archive(Path(sys.argv[2]), "cpu", scratch=Path(sys.argv[3]), threads=1)
    core.answer(Path(sys.argv[4]).read_bytes())
    print(json.dumps({"format": core.record.format, "modules": sorted(sys.modules)}))
else:
    print(json.dumps({"modules": sorted(sys.modules)}))
"""


def imported(modules: tuple[str, ...], *opening: str) -> dict:
    """What a fresh interpreter imported for `modules` (and, with an archive, a scratch folder and a photo: for
    opening it and one answer), and the served format."""
    done = subprocess.run([sys.executable, "-c", OPEN_AND_ANSWER, ",".join(modules), *opening], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def loaded(found: dict, package: str) -> list[str]:
    return [name for name in found["modules"] if name == package or name.startswith(package + ".")]


def test_the_workers_modules_import_nothing_serving_never_needs():
    found = imported(TORCHSERVE_WORKER + KSERVE_WORKER)
    assert not [name for package in NEVER_SERVED for name in loaded(found, package)]
    # no format's runtime either: each is imported when its form is opened (runtime/base.py's BACKENDS)
    assert not [name for libraries in FORMAT_LIBRARIES.values() for package in libraries
                for name in loaded(found, package)]


@pytest.mark.slow
def test_opening_an_archive_and_answering_imports_only_the_served_forms_runtime(resnet18_export, tmp_path):
    found = imported(TORCHSERVE_WORKER + KSERVE_WORKER + KSERVE_SERVER + RAY_REPLICA,
                     str(resnet18_export["archive"]), str(tmp_path / "model"), str(CAT))
    assert not [name for package in NEVER_SERVED for name in loaded(found, package)]
    others = [fmt for fmt in BACKENDS if fmt != found["format"]]
    assert not [module for fmt in others if (module := BACKENDS[fmt].split(":")[0]) in found["modules"]]
    assert not [name for fmt in others for package in FORMAT_LIBRARIES.get(fmt, ())
                for name in loaded(found, package)]
