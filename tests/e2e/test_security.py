"""Security posture of a real TorchServe started our way: loopback-only APIs, no model registration from a
URL, registration limited to the local model store, token authorisation end to end (python -m serving and
its readiness check, the benchmark), bounded request and response sizes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from serving.torchserve import server
from serving.torchserve.config import DEFAULT_CONFIG, free_port
from tests.answers import assert_same_answer, expected_answer
from tests.conftest import ROOT

pytestmark = pytest.mark.slow
CAT = ROOT / "examples" / "cat.jpg"


def listening_addresses(port: int) -> set[str]:
    """Local addresses a TCP port listens on, read from /proc/net/tcp{,6} (no traffic sent)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if int(hex_port, 16) == port and state == "0A":  # LISTEN
                found.add("127.0.0.1" if address in ("0100007F", "0000000000000000FFFF00000100007F") else address)
    return found


def test_the_shipped_config_binds_loopback_and_bounds_sizes():
    config = dict(line.split("=", 1) for line in DEFAULT_CONFIG.read_text().splitlines()
                  if "=" in line and not line.startswith("#"))
    for key in ("inference_address", "management_address", "metrics_address"):
        assert config[key].startswith("http://127.0.0.1:")
    assert config["enable_model_api"] == "false"
    assert config["allowed_urls"] == "file://.*[.]mar"  # local archives only, even if registration is switched on
    assert int(config["max_request_size"]) <= 8 * 2**20 and int(config["max_response_size"]) <= 8 * 2**20


@pytest.fixture(scope="module")
def default_server(resnet18_server):
    return resnet18_server


def test_apis_listen_on_loopback_only(default_server):
    for port in (default_server.inference_port, default_server.management_port, default_server.metrics_port):
        assert listening_addresses(port) == {"127.0.0.1"}, port


def test_registering_a_model_from_a_url_is_refused(default_server):
    """Registration is on (a rollout registers versions beside the live one), from the model store only."""
    for url in ("http://127.0.0.1:1/evil.mar", "file:///etc/passwd.mar", "../../../tmp/evil.mar"):
        response = requests.post(f"{default_server.management_url}/models", params={"url": url}, timeout=30)
        assert response.status_code == 404 and "not" in response.json()["message"], response.text


def test_with_the_model_api_on_only_the_local_model_store_may_register(resnet18_export, tmp_path):
    settings = server.on_free_ports(resnet18_export["model_store"], tmp_path / "run")
    settings.run_dir.mkdir(parents=True)
    settings.model_name = resnet18_export["model_name"]
    settings.extra_env = {"TS_ENABLE_MODEL_API": "true"}
    with server.running(settings, CAT):
        response = requests.post(f"{settings.management_url}/models",
                                 params={"url": "http://127.0.0.1:1/evil.mar"}, timeout=30)
    assert response.status_code >= 400 and "allowed" in response.text.lower(), response.text


def run_serving(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "serving", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_token_authorisation_end_to_end(resnet18_export, tmp_path):
    run_dir = tmp_path / "run"
    ports = [free_port() for _ in range(5)]
    args = ["--model-store", str(resnet18_export["model_store"]), "--run-dir", str(run_dir),
            "--inference-port", str(ports[0]), "--management-port", str(ports[1]), "--metrics-port", str(ports[2]),
            "--grpc-inference-port", str(ports[3]), "--grpc-management-port", str(ports[4]),
            "--signals-port", str(free_port())]
    started = run_serving(*args, "--detach", "--token-auth")
    try:
        assert started.returncode == 0, started.stdout + started.stderr  # its readiness check used the key
        assert "Authorization: Bearer <inference key" in started.stdout
        name = resnet18_export["model_name"]
        settings = server.ServerSettings(inference_port=ports[0], management_port=ports[1], run_dir=run_dir,
                                         token_auth=True, model_name=name)
        body, jpeg = CAT.read_bytes(), {"Content-Type": "image/jpeg"}
        anonymous = requests.post(settings.predictions_url(), data=body, headers=jpeg, timeout=30)
        assert anonymous.status_code == 400 and "Token Authorization failed" in anonymous.text
        anonymous_management = requests.get(f"{settings.management_url}/models/{name}", timeout=30)
        assert anonymous_management.status_code == 400 and "Token Authorization failed" in anonymous_management.text
        wrong_key = requests.post(settings.predictions_url(), data=body, timeout=30,
                                  headers={**jpeg, **server.auth_headers(settings, "management")})
        assert wrong_key.status_code == 400  # the management key is not an inference key
        allowed = requests.post(settings.predictions_url(), data=body, timeout=30,
                                headers={**jpeg, **server.auth_headers(settings)})
        assert allowed.status_code == 200, allowed.text
        assert_same_answer(allowed.json(), expected_answer(resnet18_export["archive"], body))
        managed = requests.get(f"{settings.management_url}/models/{name}", timeout=30,
                               headers=server.auth_headers(settings, "management"))
        assert managed.status_code == 200 and managed.json()[0]["workers"]
    finally:
        run_serving("stop", "--run-dir", str(run_dir), timeout=120)


@pytest.mark.skipif(shutil.which("hey") is None, reason="the load generator hey is not installed")
def test_the_benchmark_works_with_token_authorisation(resnet18_export, tmp_path):
    done = subprocess.run([sys.executable, "-m", "measure", "bench", "--export-dir", str(resnet18_export["out"]),
                           "--configurations", "default", "--requests", "10", "--concurrency", "1",
                           "--warmup", "1",
                           "--inprocess", "none", "--token-auth", "--out", str(tmp_path / "bench")], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    row = __import__("json").loads((tmp_path / "bench" / "results.json").read_text())[0]
    assert row["failed"] == 0 and row["requests"] == 10
