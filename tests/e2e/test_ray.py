"""The ray engine on one node: Ray Serve (a head node of its own, on 127.0.0.1) serving the .mar that `python -m
export resnet` built through our request core. Every answer is compared with the same artifact run in-process on
the same image (tests/answers.py) and with a real TorchServe's; the bad-input matrix of the TorchServe path
(tests/e2e/test_bad_input.py) gets the same statuses and reasons; a tampered archive deployed onto the running
cluster (--address) is refused with the sha256 reason and leaves the first application serving; stop leaves no
process of the node behind. One cluster for the module: a start costs tens of seconds."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import zipfile

import pytest
import requests

from contract.records import Manifest
from handlers.policy import ServingPolicy
from serving.ray.cluster import process_name, session_members
from serving.settings import ServingError, free_port
from tests.answers import assert_same_answer
from tests.conftest import ROOT
from tests.e2e.readiness import watch_readiness
from tests.e2e.test_bad_input import CASES, JPEG, OK, assert_outcome, b64, interleaved_jobs

pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install '.[ray]' (an optional extra)")
from serving.ray.config import RaySettings  # noqa: E402  (needs ray only at run time; after the skip for clarity)
from serving.ray.deployment import SERVED_BY  # noqa: E402
from serving.ray.engine import RayServe  # noqa: E402

pytestmark = pytest.mark.slow
CAT = ROOT / "examples" / "cat.jpg"
# One replica of one CPU: the machine's other core stays free for the tampered deployment and the test itself.
ONE_REPLICA = ServingPolicy(workers=1, batch_size=1, max_batch_delay_ms=5, threads_per_worker=1, device="cpu",
                            reason="tests: one replica")
NAME = "clf"  # the module's application serves resnet18.mar as clf: answers and labels name clf, not resnet18


@pytest.fixture(scope="module")
def served(resnet18_export, tmp_path_factory):
    store = tmp_path_factory.mktemp("ray-store")
    (store / f"{NAME}.mar").hardlink_to(resnet18_export["archive"])
    settings = RaySettings(store, (NAME,), http_port=free_port(), run_dir=tmp_path_factory.mktemp("ray"),
                           policy=ONE_REPLICA, signals_port=free_port())
    engine = RayServe(settings)
    with engine.running(CAT) as process:
        yield settings, process
    assert not session_members(process.pid), "processes of the Ray node survived stop()"
    assert not settings.address_file.exists()


@pytest.fixture(scope="module")
def settings(served) -> RaySettings:
    return served[0]


def post(settings: RaySettings, body: bytes, headers: dict | None = None, model: str = NAME, **kwargs):
    return requests.post(settings.predictions_url(model), data=body, headers=headers, timeout=60, **kwargs)


def test_answers_as_the_artifact_in_process_and_names_where_it_ran(settings, expect):
    response = post(settings, CAT.read_bytes(), JPEG)
    assert response.status_code == 200, response.text
    assert_same_answer(response.json(), expect(CAT.read_bytes()))
    assert (response.json()["model"], response.json()["architecture"]) == (NAME, "resnet18")
    node, replica = response.headers[SERVED_BY].split()
    assert len(node) == 56 and replica, response.headers  # Ray's node id: 28 bytes in hex


def test_json_and_form_bodies_with_their_topk(settings, expect):
    as_json = post(settings, json.dumps({"data": b64(CAT.read_bytes()), "topk": 2}).encode(),
                   {"Content-Type": "application/json"})
    form = requests.post(settings.predictions_url(NAME), files={"file": CAT.read_bytes()},
                         data={"topk": "3"}, timeout=60)
    assert as_json.status_code == 200 and form.status_code == 200, (as_json.text, form.text)
    assert_same_answer(as_json.json(), expect(CAT.read_bytes(), 2))
    assert_same_answer(form.json(), expect(CAT.read_bytes(), 3))


def test_same_answer_as_torchserve(settings, resnet18_server):
    ours = post(settings, CAT.read_bytes(), JPEG)
    theirs = requests.post(resnet18_server.predictions_url(), data=CAT.read_bytes(), headers=JPEG, timeout=60)
    assert ours.status_code == theirs.status_code == 200, (ours.text, theirs.text)
    assert_same_answer(ours.json(), theirs.json())


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_matrix_as_on_the_torchserve_path(settings, case):
    body, headers, expected = CASES[case]
    response = post(settings, body, headers)
    assert_outcome(response, expected)
    if case == "topk 3 in a header":
        assert len(response.json()["predictions"]) == 3


def test_a_form_without_a_file_and_a_get_without_a_body(settings):
    form = requests.post(settings.predictions_url(NAME), files={"topk": (None, "3")}, timeout=60)
    assert_outcome(form, (400, "no image in the request"))
    assert_outcome(requests.get(settings.predictions_url(NAME), timeout=60), (400, "empty request"))


def test_the_model_description_says_which_form_serves_here_and_why(settings, resnet18_export):
    served = Manifest.read(resnet18_export["out"]).serving.served
    described = requests.get(settings.predictions_url(NAME) + "/description", timeout=60)
    assert described.status_code == 200, described.text
    assert described.json()["artifact"] == served and described.json()["why"].startswith(f"serving {served} on ")
    assert described.json()["policy"] == ONE_REPLICA.describe()  # as the run config holds it, its reasons too
    assert described.json()["policy"]["why"][0] == "workers 1: tests: one replica"


def test_bad_and_good_requests_interleaved_and_the_replica_survives(settings, expect):
    jobs = interleaved_jobs(16)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda job: post(settings, job[0], job[1]), jobs))
    for (body, _, expected), response in zip(jobs, responses):
        assert_outcome(response, expected)
        if expected == OK:
            assert_same_answer(response.json(), expect(body))
    assert len({response.headers[SERVED_BY] for response in responses}) == 1, "the replica was replaced"


def test_a_tampered_archive_is_refused_on_the_running_cluster_and_the_first_keeps_serving(
        settings, resnet18_export, tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    tampered = store / "tampered.mar"
    with zipfile.ZipFile(resnet18_export["archive"]) as source, zipfile.ZipFile(tampered, "w") as target:
        for item in source.infolist():
            data = source.read(item.filename)
            if item.filename.endswith(".onnx"):
                data = data[:-64] + bytes(64)  # the served artifact, its last bytes zeroed
            target.writestr(item, data)
    joined = RaySettings(store, ("tampered",), http_port=settings.http_port, run_dir=tmp_path / "run",
                         address=settings.address_file.read_text(), policy=ONE_REPLICA, signals_port=free_port())
    with pytest.raises(ServingError, match="sha256"):
        with RayServe(joined).running(CAT, timeout=180):
            pass
    assert post(settings, CAT.read_bytes(), JPEG).status_code == 200
    assert post(settings, CAT.read_bytes(), JPEG, model="tampered").status_code == 404



def test_signals_ids_metrics_scraped_by_prometheus_and_health(settings, tmp_path):
    """Our signals on Ray (serving/ray/signals.py): an id returned on answers and error bodies, the replicas'
    metrics on the server's fixed port, a real Prometheus' p99 agreeing with hey's, readiness true."""
    from tests.prometheus import agrees_with_hey, prometheus
    answer = post(settings, CAT.read_bytes(), {"Content-Type": "image/jpeg", "X-Request-ID": "ray-cat-4711"})
    assert answer.status_code == 200 and answer.headers["X-Request-ID"] == "ray-cat-4711"
    error = post(settings, b"this is not an image", {"Content-Type": "image/jpeg", "X-Request-ID": "ray-bad-4712"})
    assert error.status_code == 415 and error.json()["request_id"] == "ray-bad-4712"
    assert requests.get(f"{settings.signals_url}/health/ready", timeout=30).json() == {"ready": True}
    with prometheus({"ray": f"{settings.signals_url}/metrics"}, tmp_path / "prometheus") as server:
        # the client's wait from Serve's proxy log: our replica's timer starts behind the proxy
        agrees_with_hey(server, settings.predictions_url(NAME), CAT, "image/jpeg", NAME, concurrency=1)
    text = requests.get(f"{settings.signals_url}/metrics", timeout=10).text
    assert 'code="415"' in text and "vision_stage_duration_seconds_bucket" in text
    assert f'vision_front_request_duration_seconds_count{{code="415",model="{NAME}"}}' in text
    assert re.search(rf'^vision_request_duration_seconds_count{{[^}}]*model="{NAME}"[^}}]*}} [1-9]', text, re.M)
    assert 'model="resnet18"' not in text  # every label names the model as served, never its architecture
    assert 'stage="queue"' in text  # each request's wait for its batch, recorded by the replica's batcher


READY_LOST_S = 10  # Serve asks each replica every HEALTH_CHECK_PERIOD_S whether it lives; our readiness asks Serve
REPLACED_S = 180  # a new replica: a process, the archive unpacked, its artifact opened, on a busy machine


def replica_pids(process) -> list[int]:
    """The model's replica processes in the Ray session the server process started (Ray titles them by class,
    ray::ServeReplica:APP:DEPLOYMENT: its gate's, APP NAME.gate, is not one of them)."""
    return [pid for pid in session_members(process.pid) if f"ServeReplica:{NAME}:" in process_name(pid)]


def test_not_ready_when_the_replica_dies_ready_again_when_replaced_no_wrong_answer(served, expect):
    """The model's one replica killed: readiness says no within READY_LOST_S, yes once Serve has replaced it; the
    requests sent meanwhile are answered by the new replica or get a 5xx, never a wrong answer. Last in the
    module: the replica it leaves is another."""
    settings, process = served
    (replica,) = replica_pids(process)
    outage = watch_readiness(
        lambda: os.kill(replica, signal.SIGKILL),
        lambda: requests.post(settings.predictions_url(NAME), data=CAT.read_bytes(), headers=JPEG,
                              timeout=REPLACED_S),
        f"{settings.signals_url}/health/ready", READY_LOST_S, REPLACED_S)
    for response in outage.responses:
        if response.status_code == 200:  # never a wrong answer: a 200 is the artifact's
            assert_same_answer(response.json(), expect(CAT.read_bytes()))
        else:
            assert response.status_code >= 500, response.text
    assert replica not in replica_pids(process)
    response = post(settings, CAT.read_bytes(), JPEG)
    assert response.status_code == 200, response.text
    assert_same_answer(response.json(), expect(CAT.read_bytes()))
