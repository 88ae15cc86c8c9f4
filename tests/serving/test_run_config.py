"""`python -m serving` decides the policy for the machine it runs on and writes it into TorchServe's config."""

import json
import subprocess
import sys

import pytest
import torch

from handlers.policy import GPU_BATCH_SIZE, machine_policy
from serving.__main__ import decide_policy, parse
from serving.torchserve.server import ServerSettings, ServingError, run_config_text
from tests.conftest import ROOT


def models_setting(text: str) -> dict:
    line = next(l for l in text.splitlines() if l.startswith("models="))
    return json.loads(line.split("=", 1)[1])


def test_the_config_carries_the_policy_for_the_model():
    policy = machine_policy(gpus=0, cores=2)
    text = run_config_text(ServerSettings(model_name="resnet"), policy)
    setting = models_setting(text)["resnet"]["1.0"]
    assert setting["marName"] == "resnet.mar" and setting["defaultVersion"] is True
    assert (setting["minWorkers"], setting["maxWorkers"], setting["batchSize"]) == (2, 2, 1)
    assert "inference_address=http://127.0.0.1:8080" in text  # the base config is kept


def test_a_gpu_host_gets_the_gpu_policy_whatever_machine_exported(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    policy = decide_policy(parse([]))
    assert policy.device == "gpu" and policy.batch_size == GPU_BATCH_SIZE and policy.workers == 1


def test_command_line_overrides_and_their_validation():
    policy = decide_policy(parse(["--workers", "1", "--batch-size", "4"]))
    assert (policy.workers, policy.batch_size) == (1, 4)
    with pytest.raises(ServingError, match="--workers must be at least 1, got 0"):
        decide_policy(parse(["--workers", "0"]))


def test_config_action_writes_the_file_and_needs_out(tmp_path):
    out = tmp_path / "config.properties"
    done = subprocess.run([sys.executable, "-m", "serving", "config", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert models_setting(out.read_text())["resnet"]["1.0"]["minWorkers"] >= 1
    missing = subprocess.run([sys.executable, "-m", "serving", "config"], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
    assert missing.returncode == 1 and "needs --out PATH" in missing.stderr and "Traceback" not in missing.stderr
