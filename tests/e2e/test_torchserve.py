"""A real TorchServe (Java frontend, Python worker) on 127.0.0.1 with free ports, serving the .mar that
`python -m export resnet` built, answering real HTTP. Every answer is compared with the same artifact run
in-process through handlers.core on the same image (tests/answers.py)."""

from __future__ import annotations

import base64
import concurrent.futures
import io
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import requests
from PIL import Image

from contract.records import Manifest
from export.package.archive import build_archive
from handlers.image_classifier import ID_HEADER
from handlers.policy import policies_in
from measure.reliability.workers import ready_pids, wait_all_ready
from serving.torchserve import server
from serving.torchserve.config import RUN_CONFIG
from serving.torchserve.server import free_port
from tests.answers import assert_same_answer
from tests.conftest import ROOT
from tests.e2e.readiness import watch_readiness

pytestmark = pytest.mark.slow
CAT = ROOT / "examples" / "cat.jpg"


def _settings(model_store: Path, run_dir: Path, model_name: str) -> server.ServerSettings:
    settings = server.on_free_ports(model_store, run_dir)
    settings.model_name = model_name
    return settings


def _no_process_mentions(text: str) -> bool:
    found = subprocess.run(["pgrep", "-f", text], capture_output=True, text=True)
    return found.stdout.strip() == ""


@pytest.fixture(scope="module")
def serving(resnet18_server):
    return resnet18_server


def _post(settings, data, headers=None, files=None, timeout=60):
    return requests.post(settings.predictions_url(), data=data, headers=headers, files=files, timeout=timeout)


def _image(fmt: str, mode="RGB", size=(320, 240)) -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, (10, 200, 30) if mode == "RGB" else 128).save(buffer, fmt)
    return buffer.getvalue()


def _assert_answer(response, expected: dict) -> dict:
    """200, and the answer the same artifact gives in-process on the same image."""
    assert response.status_code == 200, response.text
    body = response.json()
    assert_same_answer(body, expected)
    return body


def test_raw_jpeg(serving, expect):
    body = _assert_answer(_post(serving, CAT.read_bytes(), {"Content-Type": "image/jpeg"}), expect(CAT.read_bytes()))
    assert body["model"] == "resnet18" and len(body["predictions"]) == 5


def test_raw_png_and_webp(serving, expect):
    for fmt in ("PNG", "WEBP"):
        _assert_answer(_post(serving, _image(fmt), {"Content-Type": f"image/{fmt.lower()}"}), expect(_image(fmt)))


def test_base64_json(serving, expect):
    payload = {"data": base64.b64encode(CAT.read_bytes()).decode()}
    _assert_answer(requests.post(serving.predictions_url(), json=payload, timeout=60), expect(CAT.read_bytes()))
    payload["topk"] = 3
    response = requests.post(serving.predictions_url(), json=payload, timeout=60)
    _assert_answer(response, expect(CAT.read_bytes(), 3))


def test_multipart_form_file(serving, expect):
    files = {"image": ("cat.jpg", CAT.read_bytes(), "image/jpeg")}
    _assert_answer(_post(serving, None, files=files), expect(CAT.read_bytes()))
    response = _post(serving, {"topk": "2"}, files={"photo": ("cat.jpg", CAT.read_bytes(), "image/jpeg")})
    _assert_answer(response, expect(CAT.read_bytes(), 2))


def test_same_image_same_answer_in_any_encoding(serving):
    raw = _post(serving, CAT.read_bytes(), {"Content-Type": "image/jpeg"}).json()["predictions"]
    form = _post(serving, None, files={"f": ("c.jpg", CAT.read_bytes(), "image/jpeg")}).json()["predictions"]
    assert raw == form


def test_topk_header(serving, expect):
    response = _post(serving, CAT.read_bytes(), {"Content-Type": "image/jpeg", "X-TopK": "10"})
    _assert_answer(response, expect(CAT.read_bytes(), 10))


@pytest.mark.parametrize("body,code", [
    (b"this is not an image", 415),
    (CAT.read_bytes()[:3000], 400),  # a real JPEG cut short
])
def test_bad_input_is_a_4xx_json_error_and_the_worker_survives(serving, expect, body, code):
    workers_before = _worker_pids(serving)
    response = _post(serving, body, {"Content-Type": "image/jpeg"})
    assert response.status_code == code
    assert response.json()["code"] == code and response.json()["error"]
    _assert_answer(_post(serving, CAT.read_bytes(), {"Content-Type": "image/jpeg"}), expect(CAT.read_bytes()))
    assert _worker_pids(serving) == workers_before


def test_decompression_bomb_is_refused_with_413(serving):
    buffer = io.BytesIO()
    Image.new("1", (9000, 9000)).save(buffer, "PNG", optimize=True)  # 81 Mpx in a few kB
    response = _post(serving, buffer.getvalue(), {"Content-Type": "image/png"})
    assert response.status_code == 413 and "pixels" in response.json()["error"]


def test_signals_ids_metrics_scraped_by_prometheus_and_health(serving, tmp_path):
    """Our metrics and health beside TorchServe (serving/signals.py): an id returned and logged with the stage
    times, a real Prometheus' p99 agreeing with hey's, the dashboard's queries answered, readiness true."""
    from tests.prometheus import agrees_with_hey, check_dashboard, prometheus
    answer = _post(serving, CAT.read_bytes(), {"Content-Type": "image/jpeg", "X-Request-ID": "ts-cat-4711"})
    assert answer.status_code == 200 and answer.headers[ID_HEADER] == "ts-cat-4711"
    assert answer.headers["X-Request-ID"] != "ts-cat-4711"  # TorchServe's frontend sets its own over ours
    error = _post(serving, b"this is not an image", {"Content-Type": "image/jpeg", "X-Request-ID": "ts-bad-4712"})
    assert error.status_code == 415 and error.json()["request_id"] == error.headers[ID_HEADER] == "ts-bad-4712"
    unnamed = _post(serving, CAT.read_bytes(), {"Content-Type": "image/jpeg"})  # without an id, TorchServe's serves
    assert unnamed.headers[ID_HEADER] == unnamed.headers["X-Request-ID"]
    assert requests.get(f"{serving.signals_url}/health/ready", timeout=30).json() == {"ready": True}
    with prometheus({"torchserve": f"{serving.signals_url}/metrics"}, tmp_path / "prometheus") as server:
        # the client's wait from TorchServe's access log: its Java frontend's queue is behind our worker's timer
        agrees_with_hey(server, serving.predictions_url(), CAT, "image/jpeg", serving.model_name)
        check_dashboard(server, ROOT / "serving" / "grafana" / "vision-export.json", serving.model_name)
    log = (serving.log_dir / "model_log.log").read_text(errors="replace")
    line = next(line for line in log.splitlines() if "request ts-cat-4711 " in line)
    assert "model=resnet18" in line and "form=" in line and "version=" in line and "inference_ms=" in line
    assert f"request {unnamed.headers[ID_HEADER]} " in log
    theirs = requests.get(f"{serving.metrics_url}/metrics", timeout=10).text  # the queue's mean (no stage of ours)
    assert "ts_queue_latency_microseconds{" in theirs and "ts_inference_requests_total{" in theirs


READY_LOST_S = 5  # how soon readiness says no once every worker of the model died (it asks their pids each time)
RESTARTED_S = 180  # TorchServe restarts a dead worker after a back-off of seconds; loading it takes more when busy


def test_not_ready_when_every_worker_is_killed_ready_again_when_restarted_no_wrong_answer(serving, expect):
    """Every worker of the shared server killed: readiness says no within READY_LOST_S and yes once TorchServe has
    restarted one; the requests sent meanwhile wait for a worker or get a 5xx, never a wrong answer. The test ends
    once every worker is READY again, as the shared server's other tests expect."""
    pids = ready_pids(serving)

    def kill_every_worker() -> None:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)

    outage = watch_readiness(
        kill_every_worker,
        lambda: _post(serving, CAT.read_bytes(), {"Content-Type": "image/jpeg"}, timeout=RESTARTED_S),
        f"{serving.signals_url}/health/ready", READY_LOST_S, RESTARTED_S)
    for response in outage.responses:
        if response.status_code == 200:  # never a wrong answer: a 200 is the artifact's
            _assert_answer(response, expect(CAT.read_bytes()))
        else:
            assert response.status_code >= 500, response.text
    assert not set(wait_all_ready(serving)) & set(pids)
    _assert_answer(_post(serving, CAT.read_bytes(), {"Content-Type": "image/jpeg"}), expect(CAT.read_bytes()))


def test_the_model_description_says_which_form_serves_here_and_why(serving, resnet18_export):
    """TorchServe's describe API asks the handler (customized=true): the core's choice on this machine."""
    served = Manifest.read(resnet18_export["out"]).serving.served
    described = requests.get(f"{serving.management_url}/models/{serving.model_name}?customized=true", timeout=30)
    assert described.status_code == 200, described.text
    metadata = described.json()[0]["customizedMetadata"]
    assert metadata["artifact"] == served and metadata["choice"]["served"] == served
    assert metadata["why"].startswith(f"serving {served} on ") and metadata["backend"]
    # and the serving policy as `python -m serving` resolved it and wrote it in the run config, with its reasons
    (policy,) = policies_in(serving.run_dir.absolute() / RUN_CONFIG).values()
    assert metadata["policy"] == policy.describe() and "batch delay 40 ms: the archive pins it" in policy.lines()
    assert metadata["policy"]["workers"] == len(_worker_pids(serving))


def _worker_pids(settings) -> list:
    workers = requests.get(f"{settings.management_url}/models/{settings.model_name}", timeout=10).json()[0]["workers"]
    assert all(w["status"] == "READY" for w in workers)
    return sorted(w["pid"] for w in workers)


# ---------------------------------------------------------------- batching, and failing fast


@pytest.fixture(scope="module")
def batching_server(resnet18_export, tmp_path_factory):
    """Same export, archived with a long batch delay so concurrent requests share one batch."""
    store = tmp_path_factory.mktemp("batch-store")
    out = resnet18_export["out"]
    one_batching_worker = {"minWorkers": 1, "maxWorkers": 1, "batchSize": 4, "maxBatchDelay": 3000}
    archive = build_archive(out, Manifest.read(out), store, config_overrides=one_batching_worker)
    settings = _settings(store, tmp_path_factory.mktemp("batch-run"), archive.stem)
    with server.running(settings, CAT):
        yield settings


def test_one_bad_image_in_a_batch_gets_its_own_error(batching_server, expect):
    bodies = [CAT.read_bytes(), b"garbage, not an image", _image("PNG"), _image("BMP")]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda b: _post(batching_server, b, {"Content-Type": "image/jpeg"}), bodies))
    assert [r.status_code for r in responses] == [200, 415, 200, 200]
    assert responses[1].json() == {"code": 415, "error": responses[1].json()["error"],
                                   "request_id": responses[1].json()["request_id"]}
    for body, response in zip(bodies, responses):  # batched, each row still gets its own image's answer
        if response.status_code == 200:
            _assert_answer(response, expect(body))
    log = (batching_server.log_dir / "model_log.log").read_text()
    assert "batch of 4:" in log, "the four requests were not served as one batch"


def test_a_model_that_cannot_load_fails_fast_with_the_handlers_error(resnet18_export, tmp_path):
    store = tmp_path / "store"
    good = build_archive(resnet18_export["out"], Manifest.read(resnet18_export["out"]), store)
    # a setting the handler does not know (the served artifact was once chosen here; the manifest decides now)
    _rewrite_member(good, "model-config.yaml", lambda text: text.replace("handler:\n", "handler:\n  artifact: scripted\n"))
    settings = _settings(store, tmp_path / "run", good.stem)
    process = server.start(settings)
    started = time.monotonic()
    try:
        with pytest.raises(server.ServingError, match="model-config.yaml handler: unknown artifact"):
            server.wait_until_serving(settings, process, CAT, timeout=200)
        assert time.monotonic() - started < 120
    finally:
        server.stop(settings, process)
    assert _no_process_mentions(str(tmp_path / "run"))


def _rewrite_member(archive: Path, name: str, change) -> None:
    with zipfile.ZipFile(archive) as source:
        members = {info.filename: source.read(info) for info in source.infolist()}
    members[name] = change(members[name].decode()).encode()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as target:
        for member, data in members.items():
            target.writestr(member, data)


def test_serving_command_detach_then_stop(resnet18_export, tmp_path):
    ports = [str(free_port()) for _ in range(5)]
    args = ["--model-store", str(resnet18_export["model_store"]), "--run-dir", str(tmp_path / "run"),
            "--models", resnet18_export["model_name"],
            "--inference-port", ports[0], "--management-port", ports[1], "--metrics-port", ports[2],
            "--grpc-inference-port", ports[3], "--grpc-management-port", ports[4], "--signals-port", str(free_port())]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = subprocess.run([sys.executable, "-m", "serving", *args, "--detach"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"curl -X POST http://127.0.0.1:{ports[0]}/predictions/resnet18 " in started.stdout
        assert requests.get(f"http://127.0.0.1:{ports[0]}/ping", timeout=10).status_code == 200
    finally:
        stopped = subprocess.run([sys.executable, "-m", "serving", "stop", "--run-dir", str(tmp_path / "run")],
                                 cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert "TorchServe stopped" in stopped.stdout
    assert _no_process_mentions(str(tmp_path / "run"))
