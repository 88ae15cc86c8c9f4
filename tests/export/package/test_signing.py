"""`python -m export --sign-key` signs the archive over every file, handler code included; where serving has the
public key (VISION_EXPORT_VERIFY_KEY), a signed archive is served and one whose handler was changed after signing
is refused at load with a clear error, on TorchServe (before its handler could run) and KServe (its worker)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest

from contract.records import Manifest
from export.cli import build_parser
from export.package.archive import ArchiveRequest, prepare_archive
from runtime.integrity import SIGN_KEY_ENV, SIGNATURE_NAME, VERIFY_KEY_ENV, verify_archive_signature
from serving.settings import free_port
from tests.conftest import ROOT
from tests.runtime.test_signatures import key_pair, rewritten

HANDLER = "torchserve_entry.py"  # what TorchServe runs first: torch-model-archiver's --handler, at the root


def test_the_export_command_takes_the_signing_key():
    parser = build_parser()
    for argv in (["resnet", "--arch", "resnet18"], ["module", "net.py:make", "--input-shape", "1,3,8,8"]):
        assert parser.parse_args([*argv, "--sign-key", "k.pem"]).sign_key.name == "k.pem"
    assert SIGN_KEY_ENV in parser._subparsers._group_actions[0].choices["resnet"].format_help()


def serving(*args: str, key, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "serving", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), VERIFY_KEY_ENV: str(key)})


@pytest.mark.slow
def test_a_signed_archive_serves_and_a_tampered_handler_is_refused_at_load(resnet18_export, tmp_path):
    private, public = key_pair(tmp_path)
    store, out = tmp_path / "store", resnet18_export["out"]
    pending = prepare_archive(out, Manifest.read(out), ArchiveRequest(store, "resnet18", sign_key=private))
    try:
        signed = pending.commit()
    finally:
        pending.discard()
    with zipfile.ZipFile(signed) as members:
        assert {HANDLER, "manifest.json", "handlers/core.py", SIGNATURE_NAME} <= set(members.namelist())
    assert verify_archive_signature(signed, public).startswith("signature verified")
    config = serving("config", "--model-store", str(store), "--run-dir", str(tmp_path / "run"), "--out",
                     str(tmp_path / "config.properties"), key=public)
    assert config.returncode == 0, config.stderr  # what the container's entrypoint runs before TorchServe

    tampered = tmp_path / "tampered"
    tampered.mkdir()
    with zipfile.ZipFile(signed) as members:
        handler = members.read(HANDLER)
    rewritten(signed, tampered / "resnet18.mar", {HANDLER: handler + b"\nimport os  # and worse\n"})
    said = f"{tampered / 'resnet18.mar'}: {HANDLER}: changed after signing"
    ports = ["--inference-port", str(free_port()), "--management-port", str(free_port()), "--metrics-port",
             str(free_port()), "--signals-port", str(free_port()), "--grpc-inference-port", str(free_port()),
             "--grpc-management-port", str(free_port())]
    torchserve = serving("--model-store", str(tampered), "--run-dir", str(tmp_path / "ts"), *ports, "--detach",
                         key=public)
    assert torchserve.returncode != 0 and said in torchserve.stderr, torchserve.stdout + torchserve.stderr
    assert "Traceback" not in torchserve.stderr and not (tmp_path / "ts" / "torchserve.pgid").exists()
    kserve = serving("--engine", "kserve", "--model-store", str(tampered), "--run-dir", str(tmp_path / "ks"),
                     "--inference-port", str(free_port()), "--detach", key=public)
    assert kserve.returncode != 0 and said in kserve.stderr, kserve.stdout + kserve.stderr
