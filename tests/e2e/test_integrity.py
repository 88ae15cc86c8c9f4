"""Verified load in a real TorchServe: an archive whose artifact no longer matches its manifest is refused
by the worker with one line naming the file and both hashes, and `python -m serving` exits non-zero with
that line instead of waiting; a truncated archive is reported as soon as TorchServe fails to open it."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from contract.records import Manifest
from export.package.archive import build_archive
from serving.torchserve.server import free_port
from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def rewrite_member(archive: Path, name: str, change) -> None:
    with zipfile.ZipFile(archive) as source:
        members = {info.filename: source.read(info) for info in source.infolist()}
    members[name] = change(members[name])
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as target:
        for member, data in members.items():
            target.writestr(member, data)


def serve_detached(store: Path, run_dir: Path, model_name: str) -> subprocess.CompletedProcess:
    ports = [str(free_port()) for _ in range(5)]
    args = ["--model-store", str(store), "--models", model_name, "--run-dir", str(run_dir),
            "--inference-port", ports[0],
            "--management-port", ports[1], "--metrics-port", ports[2], "--grpc-inference-port", ports[3],
            "--grpc-management-port", ports[4], "--signals-port", str(free_port()), "--detach", "--timeout", "200"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        return subprocess.run([sys.executable, "-m", "serving", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)
    finally:
        subprocess.run([sys.executable, "-m", "serving", "stop", "--run-dir", str(run_dir)], cwd=ROOT, env=env,
                       capture_output=True, timeout=120)


def test_a_tampered_archive_is_refused_with_the_file_and_both_hashes(resnet18_export, tmp_path):
    out = resnet18_export["out"]
    manifest = Manifest.read(out)
    store = tmp_path / "store"
    archive = build_archive(out, manifest, store)
    served = manifest.served_record()
    tampered = {}

    def flip_last_byte(data: bytes) -> bytes:
        changed = data[:-1] + bytes([data[-1] ^ 0xFF])
        tampered["sha256"] = hashlib.sha256(changed).hexdigest()
        return changed

    rewrite_member(archive, served.path, flip_last_byte)
    result = serve_detached(store, tmp_path / "run", archive.stem)
    assert result.returncode == 1, result.stdout + result.stderr
    refusal = next(line for line in result.stderr.splitlines() if line.startswith("error:"))
    assert "the model failed to load: REFUSING TO SERVE: integrity check failed" in refusal
    assert f"{served.path}: sha256 {tampered['sha256']} but the manifest records {served.sha256}" in refusal
    assert "TorchServe stopped" in result.stderr and "Traceback" not in result.stderr


def test_a_truncated_archive_fails_fast_with_a_reason(resnet18_export, tmp_path):
    out = resnet18_export["out"]
    store = tmp_path / "store"
    archive = build_archive(out, Manifest.read(out), store)
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    result = serve_detached(store, tmp_path / "run", archive.stem)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"TorchServe could not open {archive.name}: java.io.EOFException" in result.stderr
    assert "Traceback" not in result.stderr
