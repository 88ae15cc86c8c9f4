"""Smoke test of both benchmarks at a tiny size on a real resnet18 export and a real TorchServe: they run and
write their files. No timing is asserted (performance is read from the benchmark's tables, not tests)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("hey") is None, reason="the load generator hey is not installed")]


def _png(path, size=(320, 240)):
    from PIL import Image
    Image.radial_gradient("L").convert("RGB").resize(size).save(path, "PNG")
    return path


def test_in_process_pipeline_and_served_naive_default_and_litserve_per_body_write_their_files(
        resnet18_export, resnet18_inprocess_bench, tmp_path):
    out = tmp_path / "bench"
    shutil.copytree(resnet18_inprocess_bench["out"], out)  # the in-process run beside the served one, as `make bench`
    bodies = f"{ROOT / 'examples' / 'cat.jpg'},{_png(tmp_path / 'gradient.png')}"
    done = subprocess.run([sys.executable, "-m", "measure", "bench", "--export-dir", str(resnet18_export["out"]),
                           "--images", bodies, "--configurations", "naive,default,litserve", "--concurrency", "2",
                           "--duration", "1", "--warmup", "1", "--pipeline-seconds", "0.1",
                           "--inprocess", str(out / "bench.json"),
                           "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert {p.name for p in out.iterdir()} >= {"bench.md", "bench.json", "bench.png", "pipeline.md", "pipeline.json",
                                               "results.md", "results.json", "comparisons.json", "throughput.png"}
    rows = json.loads((out / "results.json").read_text())
    assert [(r["configuration"], r["body"], r["concurrency"]) for r in rows] == [
        (name, body, 2) for name in ("naive", "default", "litserve") for body in ("cat.jpg", "gradient.png", "mix")]
    assert all(r["requests"] > 0 and r["req_per_s"] > 0 and r["failed"] == 0 for r in rows)
    assert {r["model"] for r in rows} == {resnet18_export["model_name"]}  # both archives named after the model
    mix = [r for r in rows if r["body"] == "mix"]
    assert all(set(r["bodies"]) == {"cat.jpg", "gradient.png"} and all(r["bodies"].values()) for r in mix)
    default = [r for r in rows if r["configuration"] == "default"]
    # the handler's stage times were read from its log; the naive handler and the peer log none
    assert all(set(r["stages_ms"]) >= {"decode", "preprocess", "inference", "encode"} for r in default)
    assert all(r["stages_ms"] == {} for r in rows if r["configuration"] != "default")
    assert all(r["vs_naive"] is not None and r["vs_inprocess"] is not None for r in default)
    # every row has its body's pipeline ceiling (the same run's pipeline.json) and the model alone beside it
    assert all(r["pipeline_ceiling"] > 0 and r["vs_pipeline"] > 0 and r["inprocess_per_s"] > 0 for r in rows)
    ceilings = json.loads((out / "pipeline.json").read_text())
    assert set(ceilings) == {"traced", resnet18_export_served(resnet18_export)}
    text = (out / "results.md").read_text()
    assert "## Per size" in text and "| gradient.png | litserve | 2 |" in text and "litserve 0." in text
    assert "× naive" in text and "## How each row compares" in text and "Each bar is what a healthy" in text
    compared = {c["name"]: c for c in json.loads((out / "comparisons.json").read_text())}
    assert compared["errors in our configurations' rows"]["cleared"] is True
    # the rows ran at c=2 only: the comparisons at c=8 say so and what to add
    assert compared["default / litserve"]["cleared"] is None
    assert "--concurrency with 8" in compared["default / litserve"]["detail"]


def resnet18_export_served(export) -> str:
    from contract.records import Manifest
    return Manifest.read(export["out"]).decision().served_kind()
