"""Token authorisation by TorchServe's documented switch, not only by --token-auth: with
TS_DISABLE_TOKEN_AUTHORIZATION=false in the environment, or disable_token_authorization=false in the config
file, `python -m serving` starts, reads the key file TorchServe writes in its run folder, passes its readiness
check with the inference key and says where the keys are; anonymous requests are refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from serving.settings import free_port
from serving.torchserve import server
from serving.torchserve.config import DEFAULT_CONFIG, ServerSettings, token_auth_switched_on
from tests.answers import assert_same_answer, expected_answer
from tests.conftest import ROOT

CAT = ROOT / "examples" / "cat.jpg"
SWITCH = "TS_DISABLE_TOKEN_AUTHORIZATION"


def config_with(tmp_path: Path, token_line: str, envvars: str = "true") -> Path:
    text = "\n".join(line for line in DEFAULT_CONFIG.read_text().splitlines()
                     if not line.startswith(("disable_token_authorization=", "enable_envvars_config=")))
    path = tmp_path / "config.properties"
    path.write_text(f"{text}\nenable_envvars_config={envvars}\n{token_line}\n")
    return path


@pytest.mark.parametrize("token_line, environ, envvars, on", [
    ("disable_token_authorization=true", {}, "true", False),  # the shipped config: off
    ("disable_token_authorization=true", {SWITCH: "false"}, "true", True),  # the environment's switch wins
    ("disable_token_authorization=true", {SWITCH: "FALSE"}, "true", True),
    ("disable_token_authorization=false", {}, "true", True),  # the config file's switch
    ("disable_token_authorization=false", {SWITCH: "true"}, "true", False),
    ("", {}, "true", True),  # no key at all: TorchServe's own default is tokens on
    ("disable_token_authorization=true", {SWITCH: "false"}, "false", False),  # environment overrides not enabled
])
def test_the_switch_is_read_as_torchserve_reads_it(tmp_path, token_line, environ, envvars, on):
    settings = ServerSettings(config=config_with(tmp_path, token_line, envvars))
    assert token_auth_switched_on(settings, environ) is on


def test_token_auth_flag_is_on_whatever_the_config_says(tmp_path):
    settings = ServerSettings(config=config_with(tmp_path, "disable_token_authorization=true"), token_auth=True)
    assert token_auth_switched_on(settings, {SWITCH: "true"})


def test_without_a_key_file_the_headers_say_which_file_is_missing(tmp_path):
    settings = ServerSettings(run_dir=tmp_path, token_auth=True)
    with pytest.raises(server.KeysNotWritten, match=f"has not written {tmp_path / 'key_file.json'}"):
        server.auth_headers(settings)
    (tmp_path / "key_file.json").write_text('{"management": {"key": "m"}}')
    with pytest.raises(server.ServingError, match="has no inference key"):
        server.auth_headers(settings)


@pytest.mark.slow
@pytest.mark.parametrize("switch", ["environment", "config file"])
def test_the_documented_switch_serves_with_the_key_and_refuses_anonymous_requests(resnet18_export, tmp_path, switch):
    run_dir, ports = tmp_path / "run", [str(free_port()) for _ in range(5)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(SWITCH, None)
    args = ["--model-store", str(resnet18_export["model_store"]), "--run-dir", str(run_dir),
            "--inference-port", ports[0], "--management-port", ports[1], "--metrics-port", ports[2],
            "--grpc-inference-port", ports[3], "--grpc-management-port", ports[4], "--signals-port", str(free_port())]
    if switch == "environment":
        env[SWITCH] = "false"
    else:
        args += ["--config", str(config_with(tmp_path, "disable_token_authorization=false"))]
    started = subprocess.run([sys.executable, "-m", "serving", *args, "--detach"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=400)
    try:
        assert started.returncode == 0, started.stdout + started.stderr  # its readiness check used the key
        key_file = run_dir.absolute() / "key_file.json"
        assert f"keys (inference, management) in {key_file}" in started.stdout, started.stdout
        settings = ServerSettings(inference_port=int(ports[0]), run_dir=run_dir, token_auth=True,
                                  model_name=resnet18_export["model_name"])
        body, jpeg = CAT.read_bytes(), {"Content-Type": "image/jpeg"}
        anonymous = requests.post(settings.predictions_url(), data=body, headers=jpeg, timeout=60)
        # TorchServe 0.12 refuses a request without the key as a bad request (400), not 401
        assert anonymous.status_code == 400 and "Token Authorization failed" in anonymous.text, anonymous.text
        allowed = requests.post(settings.predictions_url(), data=body, timeout=60,
                                headers={**jpeg, **server.auth_headers(settings)})
        assert allowed.status_code == 200, allowed.text
        assert_same_answer(allowed.json(), expected_answer(resnet18_export["archive"], body))
    finally:
        stopped = subprocess.run([sys.executable, "-m", "serving", "stop", "--run-dir", str(run_dir)], cwd=ROOT,
                                 env=env, capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 0 and "TorchServe stopped" in stopped.stdout, stopped.stdout + stopped.stderr
