"""Smoke test of both benchmarks at a tiny size on a real resnet18 export and a real TorchServe: they run and
write their files. No timing is asserted (performance is read from the benchmark's tables, not tests)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT, run_export

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("hey") is None, reason="the load generator hey is not installed")]


def test_in_process_then_served_naive_and_default_write_their_files(resnet18_export, tmp_path):
    out = tmp_path / "bench"
    inprocess = run_export("bench", str(resnet18_export["out"]), "--batches", "1,2", "--threads", "1",
                           "--repeats", "1", "--warmup", "1", "--min-seconds", "0", "--gemm-size", "256",
                           "--out", str(out))
    assert inprocess.returncode == 0, inprocess.stdout + inprocess.stderr
    done = subprocess.run([sys.executable, "-m", "serving", "bench", "--export-dir", str(resnet18_export["out"]),
                           "--configurations", "naive,default", "--concurrency", "1,2", "--duration", "2",
                           "--inprocess", str(out / "bench.json"), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert {p.name for p in out.iterdir()} >= {"bench.md", "bench.json", "bench.png", "results.md",
                                               "results.json", "targets.json", "throughput.png"}
    rows = json.loads((out / "results.json").read_text())
    assert [(r["configuration"], r["concurrency"]) for r in rows] == [("naive", 1), ("naive", 2),
                                                                      ("default", 1), ("default", 2)]
    assert all(r["requests"] > 0 and r["failed"] == 0 for r in rows)
    assert {r["model"] for r in rows} == {resnet18_export["model_name"]}  # both archives named after the model
    default = [r for r in rows if r["configuration"] == "default"]
    # the handler's stage times were read from its log; the naive handler logs none
    assert all(set(r["stages_ms"]) >= {"decode", "preprocess", "inference", "encode"} for r in default)
    assert all(r["stages_ms"] == {} for r in rows if r["configuration"] == "naive")
    assert all(r["vs_naive"] is not None and r["vs_inprocess"] is not None for r in default)
    text = (out / "results.md").read_text()
    assert "× naive" in text and "## Targets" in text
