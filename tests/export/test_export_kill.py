"""SIGKILL of `python -m export` during each step leaves the previous complete export and archive exactly as
they were (never a manifest beside incomplete artifacts, never a half-written .mar), and the next run succeeds."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_export

pytestmark = pytest.mark.slow
USER_FILE = Path(__file__).parent / "user_models" / "models_for_tests.py"
ARGS = ["module", f"{USER_FILE}:plain", "--input-shape", "1,3,16,16", "--model-name", "net"]
# step being run -> what appears just before it (in the staging folder, or the model store for the archive)
KILL_DURING = {
    "build": ".",
    "script": "model.traced.pt",
    "ONNX (legacy, from the trace)": "model.scripted.pt",
    "ONNX (legacy, from the script)": "model.traced.onnx",
    "ONNX (torch.export)": "model.scripted.onnx",
    "checks and parity": "model.dynamo.onnx",
    "trace vs script and manifest": "parity.md",
    "archive": "store:.mar-build-*",
}


def fingerprint(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.relative_to(folder).parts[0].startswith(".")}


def appeared(marker: str, tmp_path: Path, store: Path) -> bool:
    if marker.startswith("store:"):
        return bool(list(store.glob(marker[len("store:"):])))
    return bool(list(tmp_path.glob(f".net.partial-*/{marker}" if marker != "." else ".net.partial-*")))


@pytest.fixture(scope="module")
def good_export(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("good")
    first = run_export(*ARGS, "--out", str(base / "net"), "--model-store", str(base / "store"))
    assert first.returncode == 0, first.stderr
    return base


@pytest.mark.parametrize("step", list(KILL_DURING))
def test_sigkill_during_a_step_changes_nothing_and_the_next_run_succeeds(good_export, tmp_path, step):
    out, store = tmp_path / "net", tmp_path / "store"
    shutil.copytree(good_export / "net", out)
    shutil.copytree(good_export / "store", store)
    before, archive = fingerprint(out), (store / "net.mar").read_bytes()
    process = subprocess.Popen([sys.executable, "-m", "export", *ARGS, "--out", str(out), "--model-store", str(store)],
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 180
    while not appeared(KILL_DURING[step], tmp_path, store):
        assert process.poll() is None and time.monotonic() < deadline, f"export ended before {step} could be killed"
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert fingerprint(out) == before  # the previous complete export, manifest and all, untouched
    assert [p.name for p in store.iterdir() if not p.name.startswith(".")] == ["net.mar"]
    assert (store / "net.mar").read_bytes() == archive  # never a half-written archive
    rerun = run_export(*ARGS, "--out", str(out), "--model-store", str(store))
    assert rerun.returncode == 0, rerun.stderr
    assert not list(tmp_path.glob(".net.partial-*")) and not list(store.glob(".mar-build-*"))
