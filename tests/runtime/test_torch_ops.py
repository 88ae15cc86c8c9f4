"""runtime/torch_ops.py: a TorchScript or torch.export file that calls torchvision's operators (a detector's nms)
loads and runs in a fresh interpreter that never imported torchvision (as a worker now starts), and a file that
calls none (a classifier) loads without importing it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
import torchvision

from runtime.torch_ops import names_torchvision_ops
from tests.conftest import ROOT

BOXES = torch.tensor([[0, 0, 10, 10, 0.9], [1, 1, 11, 11, 0.8], [50, 50, 60, 60, 0.7]])  # x1 y1 x2 y2 score


class Suppress(torch.nn.Module):
    """A detector's last step: the rows nms keeps, as floats (one output tensor, as a backend returns it)."""

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return torchvision.ops.nms(rows[:, :4], rows[:, 4], 0.5).float()


class Classifier(torch.nn.Module):
    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return rows.sum(dim=1)


OPEN = """
import json, sys
from pathlib import Path
import torch
from runtime.base import RunOptions
from runtime.exported_program import ExportedProgramBackend
from runtime.torchscript import TorchScriptBackend
backend = {"pt": TorchScriptBackend, "pt2": ExportedProgramBackend}[sys.argv[1].rsplit(".", 1)[1]]
rows = torch.tensor(json.loads(sys.argv[2]))
kept = backend(Path(sys.argv[1]), RunOptions(threads=1)).predict(rows)
print(json.dumps({"kept": kept.tolist(), "torchvision": "torchvision" in sys.modules}))
"""


def served(path, rows: torch.Tensor) -> dict:
    done = subprocess.run([sys.executable, "-c", OPEN, str(path), json.dumps(rows.tolist())], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def saved(module: torch.nn.Module, folder) -> list:
    scripted, exported = folder / f"{type(module).__name__}.pt", folder / f"{type(module).__name__}.pt2"
    torch.jit.script(module).save(str(scripted))
    torch.export.save(torch.export.export(module, (BOXES,)), str(exported))
    return [scripted, exported]


def test_a_file_calling_torchvisions_operators_loads_and_runs_without_torchvision_imported_first(tmp_path):
    for path in saved(Suppress(), tmp_path):
        assert names_torchvision_ops(path)
        assert served(path, BOXES) == {"kept": [0.0, 2.0], "torchvision": True}, path.name


def test_a_file_calling_none_loads_without_importing_torchvision(tmp_path):
    for path in saved(Classifier(), tmp_path):
        assert not names_torchvision_ops(path)
        assert served(path, BOXES)["torchvision"] is False, path.name
