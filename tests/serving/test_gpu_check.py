"""The GPU check without a GPU: one line and exit 0, and its pure parts (tables, targets, skips, parsing)."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from serving.gpu_check import (NO_CUDA_LINE, Report, Step, compute_targets, missing_modules, parse_nvidia_smi,
                               percentile, render_markdown)
from tests.conftest import ROOT


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the check would run for real")
def test_without_cuda_it_says_so_in_one_line_and_exits_0(tmp_path):
    done = subprocess.run([sys.executable, "-m", "serving.gpu_check", str(tmp_path / "out")], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == NO_CUDA_LINE and not done.stderr.strip()
    assert not (tmp_path / "out").exists()  # nothing measured, nothing written


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the check would run for real")
def test_no_cuda_path_imports_nothing_beyond_torch():
    code = ("import sys, serving.gpu_check as g; sys.exit(g.main(['/nonexistent']) or "
            "int(any(m in sys.modules for m in ('torchvision', 'onnxruntime', 'export', 'handlers', 'runtime'))))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_missing_modules_and_nvidia_smi_parsing():
    assert missing_modules(("json", "surely_not_a_module_xyz")) == ["surely_not_a_module_xyz"]
    assert parse_nvidia_smi("NVIDIA H100 80GB HBM3, 580.65.06, 81559 MiB\n") == \
        {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.65.06", "memory": "81559 MiB"}
    assert parse_nvidia_smi("") == {}


def test_percentile_picks_ranks():
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert percentile(list(map(float, range(1, 101))), 99) == 99.0
    assert math.isnan(percentile([], 50))  # nothing was measured


def steps(top1=0.995, served=900.0, inprocess=1000.0):
    return [Step("backends", rows=[{"variant": "torchscript fp16", "top1_agreement": top1}]),
            Step("inprocess", rows=[{"variant": "eager fp16 autocast", "batch": 32, "images_per_s": inprocess}]),
            Step("serving", rows=[{"concurrency": 32, "req_per_s": served}])]


def test_targets_are_computed_and_judged():
    met = compute_targets(steps())
    assert met["fp16 top-1 agreement with fp32"]["met"] is True
    assert met["served fp16 c=32 / in-process fp16 b=32"] == {"value": 0.9, "target": ">= 0.8", "met": True}
    missed = compute_targets(steps(top1=0.9, served=500.0))
    assert not any(t["met"] for t in missed.values())
    assert compute_targets([Step("serving", skipped="no Java")]) == {}


def test_markdown_shows_rows_skips_and_targets():
    report = Report("2026-11-22T12:00:00+00:00", {"gpu": "H100"}, steps() + [Step("export", skipped="no torchvision")])
    report.targets = compute_targets(report.steps)
    text = render_markdown(report)
    assert "| gpu | H100 |" in text and "skipped: no torchvision" in text
    assert "| torchscript fp16 | 0.995 |" in text and "(target >= 0.8): met" in text
    json.dumps(report.targets)  # the JSON file holds them as they are
