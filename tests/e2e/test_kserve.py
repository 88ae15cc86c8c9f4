"""KServe's protocol on our server (a subprocess on 127.0.0.1) serving the .mar that `python -m export resnet` built,
through our request core, called by clients no one here wrote: `requests` for v1 and `tritonclient.http` for
v2 (binary data and JSON). Every answer is compared with the same artifact run in-process on the same image
(tests/answers.py), one test compares it with a real TorchServe's, and the bad-input matrix of the TorchServe
path (tests/e2e/test_bad_input.py) gets the same statuses and reasons here. The server runs two inference
workers behind its one HTTP process (serving/kserve/pool.py): one keep-alive connection is answered by both, a
worker killed is replaced while the other answers, and one that cannot start again stops the server."""

from __future__ import annotations

import base64
import collections
import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest
import requests
import tritonclient.http as triton

from contract.policy import PolicyChoices
from contract.records import Manifest
from serving.kserve.config import KServeSettings
from serving.kserve.engine import KServe
from serving.processes import group_alive
from serving.settings import ServingError, free_port
from serving.torchserve.config import on_free_ports
from serving.torchserve.engine import TorchServe
from tests.answers import assert_same_answer
from tests.conftest import ROOT
from tests.e2e.readiness import watch_readiness
from tests.e2e.test_bad_input import CASES, JPEG, OK

pytestmark = pytest.mark.slow
CAT = ROOT / "examples" / "cat.jpg"
# Two inference workers that batch: concurrent requests share a batch (the archive pins the delay, 40 ms), each
# batch goes to a free worker. (One worker, the core in the server process: the serving command's test below.)
BATCHING = PolicyChoices(workers=2, batch_size=4, threads_per_worker=1)
NAME = "clf"  # the module's server serves resnet18.mar as clf: answers, logs and labels name clf, not resnet18
REPLACED_S = 180  # how long a killed worker's replacement may take to serve (imports torch, opens the model)


@pytest.fixture(scope="module")
def served(resnet18_export, tmp_path_factory):
    store = tmp_path_factory.mktemp("kserve-store")
    (store / f"{NAME}.mar").hardlink_to(resnet18_export["archive"])
    settings = KServeSettings(store, (NAME,), http_port=free_port(), run_dir=tmp_path_factory.mktemp("kserve"),
                              flags=BATCHING)
    with KServe(settings).running(CAT) as process:
        yield settings, process
    assert not group_alive(process.pid), "KServe processes survived stop()"


@pytest.fixture(scope="module")
def settings(served) -> KServeSettings:
    return served[0]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def predict(settings, body: dict) -> requests.Response:
    return requests.post(settings.predict_url(NAME), json=body, timeout=60)


# ---------------------------------------------------------------- v1
def test_v1_answers_as_the_artifact_in_process(settings, expect):
    response = predict(settings, {"instances": [{"image": {"b64": b64(CAT.read_bytes())}}]})
    assert response.status_code == 200, response.text
    (answer,) = response.json()["predictions"]
    assert_same_answer(answer, expect(CAT.read_bytes()))
    assert (answer["model"], answer["architecture"]) == (NAME, "resnet18")  # the name it is served under


def test_v1_several_instances_each_with_its_topk(settings, expect):
    png = CASES["RGBA"][0]
    body = {"instances": [{"image": {"b64": b64(CAT.read_bytes())}, "topk": 2}, {"data": b64(png)}]}
    response = predict(settings, body)
    assert response.status_code == 200, response.text
    first, second = response.json()["predictions"]
    assert_same_answer(first, expect(CAT.read_bytes(), 2))
    assert_same_answer(second, expect(png))


@pytest.mark.parametrize("body,words", [
    ({"instances": []}, "no instances"),
    ({"instances": [{"image": {"b64": "@@"}}]}, "not valid base64"),
    ({"instances": [{"picture": "x"}]}, "instance 0 has no base64 image"),
    ({"instances": [42]}, "instance 0 is a JSON int"),
    ({"instances": [{"image": {"b64": b64(CAT.read_bytes())}, "topk": 0}]}, "topk"),
])
def test_v1_bad_bodies_are_400_with_the_reason(settings, body, words):
    response = predict(settings, body)
    assert response.status_code == 400 and words in response.json()["error"], response.text


def test_one_bad_instance_names_its_row(settings):
    body = {"instances": [{"image": {"b64": b64(CAT.read_bytes())}}, {"image": {"b64": b64(b"not an image")}}]}
    response = predict(settings, body)
    assert response.status_code == 415 and response.json()["error"].startswith("image 1: "), response.text


# ---------------------------------------------------------------- the TorchServe path's bad-input matrix
@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_matrix_as_on_the_torchserve_path(settings, case):
    body, headers, expected = CASES[case]
    response = requests.post(settings.predict_url(NAME), data=body, headers=headers, timeout=60)
    status, words = expected  # the same request record on both engines: a text/* body is read as text on both
    assert response.status_code == status, f"{response.status_code}: {response.text[:300]}"
    answer = response.json()
    if status == 200:
        assert answer["predictions"][0]["model"] == NAME
    else:
        assert answer == {"code": status, "error": answer["error"], "request_id": answer["request_id"]}
        assert (words or "") in answer["error"]


def test_bad_and_good_requests_interleaved_are_batched_and_the_server_survives(served, expect):
    settings, process = served
    bad = [CASES[c] for c in ("random bytes", "truncated JPEG", "JSON array", "topk abc", "1x1 image")]
    jobs = [(CAT.read_bytes(), JPEG, OK) if i % 2 == 0 else bad[i // 2 % len(bad)] for i in range(24)]
    log_size = settings.log_file.stat().st_size
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda job: requests.post(settings.predict_url(NAME), data=job[0],
                                                            headers=job[1], timeout=60), jobs))
    for (body, _, (status, _)), response in zip(jobs, responses):
        assert response.status_code == status, response.text
        if status == 200:
            assert_same_answer(response.json()["predictions"][0], expect(body))
    assert process.poll() is None
    batches = [int(line.split("batch of ")[1].split(":")[0]) for line in
               settings.log_file.read_text()[log_size:].splitlines() if "batch of " in line]
    assert max(batches) > 1, f"concurrent requests were never batched: {batches}"


# ---------------------------------------------------------------- v2, with tritonclient
@pytest.fixture(scope="module")
def client(settings):
    return triton.InferenceServerClient(f"{settings.host}:{settings.http_port}")


def _infer(client, images: list, binary: bool, topk: int = 5):
    tensor = triton.InferInput("image", [len(images)], "BYTES")
    values = images if binary else [b64(image) for image in images]
    tensor.set_data_from_numpy(np.array(values, dtype=np.object_), binary_data=binary)
    outputs = [triton.InferRequestedOutput(name, binary_data=binary) for name in ("labels", "indices", "probabilities")]
    return client.infer(NAME, [tensor], outputs=outputs, parameters={"topk": topk})


@pytest.mark.parametrize("binary", [True, False], ids=["binary-data", "json"])
def test_v2_answers_as_the_artifact_in_process(client, expect, binary):
    png = CASES["RGBA"][0]
    result = _infer(client, [CAT.read_bytes(), png], binary, topk=3)
    labels, indices, probabilities = (result.as_numpy(n) for n in ("labels", "indices", "probabilities"))
    assert labels.shape == indices.shape == probabilities.shape == (2, 3)
    parameters = result.get_response()["parameters"]  # the form that served, held to that form in-process below
    assert parameters == {"model": NAME, "architecture": "resnet18", "artifact": parameters["artifact"]}
    assert result.get_response()["model_name"] == NAME
    for row, image in enumerate([CAT.read_bytes(), png]):
        served = {**parameters, "predictions": [
            {"label": label.decode() if isinstance(label, bytes) else label, "index": int(index),
             "probability": float(p)} for label, index, p in zip(labels[row], indices[row], probabilities[row])]}
        assert_same_answer(served, expect(image, 3))


def test_v2_metadata_and_readiness_as_kserve_documents_them(client, settings):
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(NAME)
    metadata = client.get_model_metadata(NAME)
    assert metadata["name"] == NAME
    assert metadata["inputs"] == [{"name": "image", "datatype": "BYTES", "shape": [-1]}]
    assert [o["name"] for o in metadata["outputs"]] == ["labels", "indices", "probabilities"]
    assert requests.get(f"{settings.url}/v1/models/{NAME}", timeout=10).json() == {"name": NAME, "ready": True}
    assert requests.get(f"{settings.url}/v1/models", timeout=10).json() == {"models": [NAME]}


def test_the_model_description_says_which_form_serves_here_and_why(settings, resnet18_export):
    served = Manifest.read(resnet18_export["out"]).serving.served
    described = requests.get(f"{settings.url}/v2/models/{NAME}/description", timeout=10)
    assert described.status_code == 200, described.text
    assert described.json()["artifact"] == served and described.json()["why"].startswith(f"serving {served} on ")
    # the model's serving policy as resolved by the engine and read from its run config, each value's reason
    assert described.json()["policy"] == settings.policies[NAME].describe()
    assert {"workers 2: --workers", "batch size 4: --batch-size", "batch delay 40 ms: the archive pins it",
            "threads 1: --threads"} == set(described.json()["policy"]["why"])
    assert [worker["worker"] for worker in described.json()["workers"]] == [1, 2]
    assert requests.get(f"{settings.url}/v2/models/nothing/description", timeout=10).status_code == 404


def test_v2_bad_requests_are_400_with_the_reason(client):
    wrong = triton.InferInput("pixels", [1], "BYTES")
    wrong.set_data_from_numpy(np.array([CAT.read_bytes()], dtype=np.object_))
    with pytest.raises(triton.InferenceServerException, match=r"\[400\].*BYTES input named \"image\""):
        client.infer(NAME, [wrong])
    with pytest.raises(triton.InferenceServerException, match=r"\[415\].*not an image"):
        _infer(client, [b"not an image"], binary=True)
    with pytest.raises(triton.InferenceServerException, match=r"\[400\].*topk"):
        _infer(client, [CAT.read_bytes()], binary=True, topk=0)


# ---------------------------------------------------------------- requests spread over the inference workers
def served_by(responses: list) -> collections.Counter:
    """How many of the responses each worker answered (X-Served-By: "worker 2 pid 4242")."""
    return collections.Counter(response.headers["X-Served-By"] for response in responses)


def workers_of(settings, model: str = NAME) -> list[dict]:
    return requests.get(f"{settings.url}/v2/models/{model}/description", timeout=10).json()["workers"]


def log_since(settings, offset: int) -> str:
    return settings.log_file.read_bytes()[offset:].decode(errors="replace")


def cat_body() -> dict:
    return {"instances": [{"image": {"b64": b64(CAT.read_bytes())}}]}


def test_one_keep_alive_connection_is_answered_by_both_workers(settings, expect):
    """Before, each KServe worker process answered the connections it had accepted: a client holding one
    connection, or a few the kernel hashed onto one worker's socket, was answered by one worker alone."""
    offset = settings.log_file.stat().st_size
    with requests.Session() as session:
        responses = [session.post(settings.predict_url(NAME), json=cat_body(), timeout=60) for _ in range(12)]
    assert [r.status_code for r in responses] == [200] * 12
    assert_same_answer(responses[-1].json()["predictions"][0], expect(CAT.read_bytes()))
    time.sleep(1)  # the access log's last line
    connections = set(re.findall(rf'127\.0\.0\.1:(\d+) - "POST /v1/models/{NAME}', log_since(settings, offset)))
    assert len(connections) == 1, f"the session used {len(connections)} connections"
    shares = served_by(responses)
    assert len(shares) == 2 and min(shares.values()) >= 4, shares


def test_two_connections_at_once_spread_over_both_workers_and_the_description_counts_them(settings):
    before = {worker["worker"]: worker["rows"] for worker in workers_of(settings)}

    def send(count: int) -> list:
        with requests.Session() as session:
            return [session.post(settings.predict_url(NAME), json=cat_body(), timeout=60) for _ in range(count)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        responses = [response for sent in pool.map(send, [8, 8]) for response in sent]
    assert [r.status_code for r in responses] == [200] * 16
    shares = served_by(responses)
    assert len(shares) == 2 and min(shares.values()) >= 4, shares
    after = {worker["worker"]: worker["rows"] for worker in workers_of(settings)}
    assert {index: after[index] - before[index] for index in after} == {
        int(name.split()[1]): count for name, count in shares.items()}


# ---------------------------------------------------------------- the same answers as TorchServe's
def test_same_answer_as_torchserve_on_the_same_photo(settings, resnet18_export, tmp_path):
    ts_settings = on_free_ports(resnet18_export["model_store"], tmp_path / "torchserve")
    ts_settings.model_name = "resnet18"
    with TorchServe(ts_settings).running(CAT):
        from_torchserve = requests.post(ts_settings.predictions_url(), data=CAT.read_bytes(), headers=JPEG,
                                        timeout=60).json()
    from_kserve = predict(settings, {"instances": [{"image": {"b64": b64(CAT.read_bytes())}}]}).json()
    assert_same_answer(from_kserve["predictions"][0], from_torchserve, atol=0)


# ---------------------------------------------------------------- the command, and refusing to serve
def test_serving_command_detach_then_stop(resnet18_export, tmp_path):
    run_dir, port = tmp_path / "run", str(free_port())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = subprocess.run([sys.executable, "-m", "serving", "--engine", "kserve", "--detach", "--model-store",
                              str(resnet18_export["model_store"]), "--run-dir", str(run_dir), "--inference-port",
                              port, "--workers", "1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    pgid = int((run_dir / "kserve.pgid").read_text()) if (run_dir / "kserve.pgid").exists() else None
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"http://127.0.0.1:{port}/v1/models/resnet18:predict" in started.stdout
        assert "sha256 verified" in (run_dir / "logs" / "kserve.log").read_text()
        # (the policy's worker processes: tests/docker/test_entrypoint.py, which starts the default policy)
    finally:
        # a plain stop: it finds the KServe server by its pid file (--engine kserve is accepted too)
        stopped = subprocess.run([sys.executable, "-m", "serving", "stop", "--run-dir", str(run_dir)], cwd=ROOT,
                                 env=env, capture_output=True, text=True, timeout=120)
    assert stopped.stdout == "the KServe server stopped\n", stopped.stdout + stopped.stderr
    assert pgid is not None and not group_alive(pgid)


def test_a_tampered_archive_is_refused_with_the_cores_reason(resnet18_export, tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    with zipfile.ZipFile(resnet18_export["archive"]) as source, \
            zipfile.ZipFile(store / "resnet18.mar", "w") as target:
        for info in source.infolist():
            data = source.read(info)
            target.writestr(info, data[:-1] + bytes([data[-1] ^ 1]) if info.filename.endswith(".onnx") else data)
    settings = KServeSettings(store, ("resnet18",), http_port=free_port(), run_dir=tmp_path / "run")
    with pytest.raises(ServingError, match="sha256"):
        with KServe(settings).running(CAT, timeout=120):
            pass


# ---------------------------------------------------------------- a worker that dies
def test_a_killed_worker_is_reported_and_replaced_while_the_other_answers(settings):
    first, second = workers_of(settings)
    offset = settings.log_file.stat().st_size
    os.kill(first["pid"], signal.SIGKILL)
    time.sleep(1)  # the server sees it at once; a request sent as it dies would be answered 500, naming it
    deadline, answered_by = time.monotonic() + REPLACED_S, collections.Counter()
    while True:
        response = predict(settings, cat_body())
        assert response.status_code == 200, response.text
        answered_by[response.headers["X-Served-By"]] += 1
        workers = workers_of(settings)
        if [worker["worker"] for worker in workers] == [1, 2]:
            break
        assert time.monotonic() < deadline, f"worker 1 not replaced in {REPLACED_S} s: {workers}"
        time.sleep(0.5)
    replaced, kept = workers
    assert replaced["pid"] != first["pid"] and replaced["restarts"] == 1 and kept["pid"] == second["pid"]
    kept_name, new_name = f"worker 2 pid {second['pid']}", f"worker 1 pid {replaced['pid']}"
    assert answered_by[kept_name] >= 1 and set(answered_by) <= {kept_name, new_name}  # the other answered meanwhile
    assert f"inference worker 1 pid {first['pid']} exited with code -9" in log_since(settings, offset)
    responses = [predict(settings, cat_body()) for _ in range(4)]
    assert new_name in served_by(responses)


def test_a_worker_that_cannot_start_again_stops_the_server_with_the_reason(resnet18_export, tmp_path):
    settings = KServeSettings(resnet18_export["model_store"], ("resnet18",), http_port=free_port(),
                              run_dir=tmp_path / "run", flags=PolicyChoices(workers=2, threads_per_worker=1))
    with KServe(settings).running(CAT) as process:
        for artifact in settings.unpacked("resnet18").glob("*.onnx"):  # what a replacement opens: now tampered
            data = bytearray(artifact.read_bytes())
            data[-1] ^= 1
            artifact.write_bytes(bytes(data))
        first, _ = workers_of(settings, "resnet18")
        os.kill(first["pid"], signal.SIGKILL)
        assert process.wait(timeout=REPLACED_S * 3) == 1  # by itself: it neither hangs nor serves on half
    log = settings.log_file.read_text()
    assert "inference worker 1 could not be started again (3 tries)" in log and "sha256" in log, log[-3000:]
    assert not group_alive(process.pid)


# ---------------------------------------------------------------- signals: ids, metrics scraped, health
READY_LOST_S = 5  # how soon readiness says no after the model's last worker died (it asks the pool each time)


def test_a_request_id_is_returned_on_answers_and_errors_and_logged_with_stage_times(settings):
    offset = settings.log_file.stat().st_size
    answer = requests.post(settings.predict_url(NAME), json=cat_body(), headers={"X-Request-ID": "cat-4711"},
                           timeout=60)
    assert answer.status_code == 200 and answer.headers["X-Request-ID"] == "cat-4711"
    error = requests.post(settings.predict_url(NAME), json={"instances": [{"image": {"b64": b64(b"nope")}}]},
                          headers={"X-Request-ID": "bad-4712"}, timeout=60)
    assert error.status_code == 415 and error.json()["request_id"] == "bad-4712"
    made = requests.post(settings.predict_url(NAME), json=cat_body(), timeout=60).headers["X-Request-ID"]
    assert re.fullmatch(r"[0-9a-f]{32}", made)
    time.sleep(1)
    log = log_since(settings, offset)
    line = next(line for line in log.splitlines() if "request cat-4711 " in line)
    assert f"model={NAME} " in line and "version=" in line and "form=" in line and "code=200" in line
    assert "inference_ms=" in line and "decode_ms=" in line
    assert any("request bad-4712 " in line and "code=415" in line for line in log.splitlines())
    assert any(f"request {made} " in line for line in log.splitlines())


def test_prometheus_p99_agrees_with_heys_and_the_dashboard_queries_answer(settings, tmp_path):
    from tests.prometheus import agrees_with_hey, check_dashboard, prometheus
    body = tmp_path / "cat.json"
    body.write_text(json.dumps(cat_body()))
    assert predict(settings, {"instances": [{"image": {"b64": b64(b"nope")}}]}).status_code == 415  # a failure
    with prometheus({"kserve": f"{settings.url}/metrics"}, tmp_path / "prometheus") as server:
        agrees_with_hey(server, settings.predict_url(NAME), body, "application/json", NAME)
        check_dashboard(server, ROOT / "serving" / "grafana" / "vision-export.json", NAME)
    text = requests.get(f"{settings.url}/metrics", timeout=10).text
    assert re.search(rf'^vision_request_duration_seconds_count{{[^}}]*model="{NAME}"[^}}]*}} [1-9]', text, re.M)
    assert 'model="resnet18"' not in text  # every label names the model as served, never its architecture
    assert 'vision_stage_duration_seconds_bucket{form="' in text and 'vision_batch_size_count{' in text
    assert 'stage="queue"' in text  # each request's wait for a free worker, recorded by the server's batcher


def test_not_ready_when_the_models_last_worker_dies_ready_again_when_replaced_no_wrong_answer(settings, expect):
    """Both workers killed, and the pool's spare (which would take a place within a second): readiness says no
    within READY_LOST_S and yes once the pool replaced them; the requests sent meanwhile wait for a worker or get
    a 5xx naming the dead one, never a wrong answer."""
    workers = workers_of(settings)
    spare = requests.get(f"{settings.url}/v2/models/{NAME}/description", timeout=10).json()["spare"]

    def kill_every_worker() -> None:
        for pid in [worker["pid"] for worker in workers] + ([spare] if spare else []):
            os.kill(pid, signal.SIGKILL)

    outage = watch_readiness(
        kill_every_worker,
        lambda: requests.post(settings.predict_url(NAME), json=cat_body(), timeout=REPLACED_S),
        f"{settings.url}/health/ready", READY_LOST_S, REPLACED_S, live_url=f"{settings.url}/health/live")
    for response in outage.responses:
        if response.status_code == 200:  # never a wrong answer: a 200 is the artifact's
            assert_same_answer(response.json()["predictions"][0], expect(CAT.read_bytes()))
        else:
            assert response.status_code >= 500 and response.json()["request_id"], response.text
    assert predict(settings, cat_body()).status_code == 200
