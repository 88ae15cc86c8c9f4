"""Two TorchServe servers side by side on one machine, each on its own ports by flags: the second, started by
`python -m serving --detach`, prints its own metrics address, and each answers its own readiness and counts only
its own requests. A third given the first's signals port (the default 8083 of two servers before ports were
checked) is refused before it starts anything, naming the port and the flag, in a moment."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
import requests

from serving.settings import free_port
from serving.torchserve.engine import PORT_SETTINGS
from tests.conftest import ROOT

pytestmark = pytest.mark.slow
CAT = ROOT / "examples" / "cat.jpg"
FLAGS = tuple(f"--{name.replace('_', '-')}" for name in PORT_SETTINGS)
SENT = 3  # predictions sent to the second server alone
REFUSED_WITHIN_S = 20  # a refusal starts nothing: the command's own start-up, no server's


def run_serving(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "serving", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def requests_counted(signals_url: str, model: str) -> float:
    """The answered requests of model that the signals server's /metrics counts (every version, form, code)."""
    text = requests.get(f"{signals_url}/metrics", timeout=30).text
    found = re.findall(rf'^vision_request_duration_seconds_count{{[^}}]*model="{model}"[^}}]*}} (\S+)$', text, re.M)
    return sum(float(value) for value in found)


def test_two_servers_side_by_side_each_report_their_own_metrics_and_readiness(resnet18_server, resnet18_export,
                                                                              tmp_path):
    """The second serves resnet18.mar as clf: its answers and its metric labels name clf, its architecture apart."""
    first, model = resnet18_server, "clf"
    store = tmp_path / "store"
    store.mkdir()
    (store / f"{model}.mar").hardlink_to(resnet18_export["archive"])
    ports = {flag: str(free_port()) for flag in FLAGS}
    second_signals = f"http://127.0.0.1:{ports['--signals-port']}"
    run_dir = tmp_path / "second"
    common = ["--model-store", str(store), "--models", model, "--workers", "1"]
    started = run_serving(*common, "--run-dir", str(run_dir), *(w for pair in ports.items() for w in pair), "--detach")
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"metrics: {second_signals}/metrics" in started.stdout.splitlines(), started.stdout
        for signals in (first.signals_url, second_signals):
            assert requests.get(f"{signals}/health/ready", timeout=30).json() == {"ready": True}, signals
        before = {url: requests_counted(url, model) for url in (first.signals_url, second_signals)}
        for _ in range(SENT):
            answer = requests.post(f"http://127.0.0.1:{ports['--inference-port']}/predictions/{model}",
                                   data=CAT.read_bytes(), headers={"Content-Type": "image/jpeg"}, timeout=60)
            assert answer.status_code == 200, answer.text
            assert (answer.json()["model"], answer.json()["architecture"]) == (model, resnet18_export["model_name"])
        assert requests_counted(second_signals, model) == before[second_signals] + SENT
        assert requests_counted(first.signals_url, model) == before[first.signals_url] == 0
        assert requests_counted(second_signals, resnet18_export["model_name"]) == 0  # no label names the architecture
        log = (run_dir / "logs" / "model_log.log").read_text(errors="replace")
        assert re.search(rf"request \S+ model={model} version=", log), log[-2000:]  # its request lines too
    finally:
        stopped = run_serving("stop", "--run-dir", str(run_dir), timeout=120)
    assert "TorchServe stopped" in stopped.stdout, stopped.stdout + stopped.stderr

    taken = {**{flag: str(free_port()) for flag in FLAGS}, "--signals-port": str(first.signals_port)}
    began = time.monotonic()
    refused = run_serving(*common, "--run-dir", str(tmp_path / "third"), *(w for pair in taken.items() for w in pair),
                          "--detach")
    assert refused.returncode == 1 and time.monotonic() - began < REFUSED_WITHIN_S, refused.stdout + refused.stderr
    assert (f"error: port {first.signals_port} (--signals-port) is in use on 127.0.0.1: stop what holds it or pass "
            "another --signals-port") in refused.stderr
    assert "TorchServe starting" not in refused.stdout and not (tmp_path / "third").exists()
    assert requests.get(f"{first.signals_url}/health/ready", timeout=30).json() == {"ready": True}  # untouched
