"""The soak command against a real TorchServe, shortened for CI (the command's default is 5 minutes), with
token authorisation on: every request of the load generator and every management call carries its key."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


@pytest.mark.skipif(shutil.which("hey") is None, reason="the load generator hey is not installed")
def test_thirty_seconds_at_concurrency_16_with_tokens_without_errors_or_growing_memory(resnet18_export, tmp_path):
    out = tmp_path / "soak"
    done = subprocess.run([sys.executable, "-m", "measure", "soak", "--model-store", str(resnet18_export["model_store"]),
                           "--duration", "30", "--slice", "10", "--concurrency", "16", "--token-auth", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "soak.json").read_text())
    assert summary["model"] == resnet18_export["model_name"]  # the store's only archive, named after the model
    assert len(summary["slices"]) >= 3 and summary["problems"] == []
    assert sum(s["requests"] for s in summary["slices"]) > 0 and all(s["errors"] == 0 for s in summary["slices"])
    assert all(g < 0.10 for g in summary["rss_growth_after_warmup"].values())
    assert (out / "run" / "key_file.json").is_file()  # TorchServe ran with token authorisation
    assert (out / "soak.png").stat().st_size > 0 and "| elapsed s |" in (out / "soak.md").read_text()
    print("\n" + (out / "soak.md").read_text())
