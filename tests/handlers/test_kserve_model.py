"""The KServe adapter in-process, with a real core on the session's resnet18 archive: KServe's own request types
(InferRequest as its data plane builds them, from tritonclient's bytes) in, our answers or RequestErrors out,
concurrent requests batched by the policy, and the pool of worker processes the model runs on with --workers 2."""

from __future__ import annotations

import asyncio
import base64
import logging

import numpy as np
import pytest
import tritonclient.http as triton
from kserve.protocol.infer_type import InferInput, InferRequest

from contract.policy import Machine, PolicyChoices, resolve_policy
from contract.versions import VERSION_HEADER
from handlers.batching import Batcher
from handlers.kserve_model import KServeModel, answered, v1_rows, v2_rows
from handlers.logs import SERVED_BY
from handlers.request_body import image_of, requested_topk
from handlers.request_error import RequestError
from serving.kserve.app import binary_request
from serving.kserve.pool import WorkerPool
from serving.processes import alive
from tests.answers import assert_same_answer, expected_answer
from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # the session's resnet18 export
CAT = (ROOT / "examples" / "cat.jpg").read_bytes()
BATCHING = resolve_policy(Machine(0, 1), flags=PolicyChoices(batch_size=4, max_batch_delay_ms=300))


@pytest.fixture(scope="module")
def model(resnet18_unpacked) -> KServeModel:
    model = KServeModel("clf", resnet18_unpacked, BATCHING)  # served under a name unlike its architecture
    model.load()
    return model


def tritonclient_request(images: list[bytes], topk: int | None = None) -> InferRequest:
    """What KServe's data plane makes of tritonclient's binary-data request (serving/kserve/app.py)."""
    tensor = triton.InferInput("image", [len(images)], "BYTES")
    tensor.set_data_from_numpy(np.array(images, dtype=np.object_))
    body, json_size = triton.InferenceServerClient.generate_request_body(
        [tensor], parameters={"topk": topk} if topk else None)
    return binary_request(body, json_size or len(body), "resnet18")


def test_v1_instances_and_torchserves_bodies_are_read_alike():
    b64 = base64.b64encode(CAT).decode()
    assert requested_topk(v1_rows({"instances": [{"image": {"b64": b64}, "topk": 2}]})[0]) == 2
    assert image_of(v1_rows({"instances": [{"data": b64}]})[0]) == CAT
    assert requested_topk(v1_rows({"data": b64, "topk": 3})[0]) == 3
    assert image_of(v1_rows(CAT, {"content-type": "image/jpeg"})[0]) == CAT  # a raw image body
    rows = v1_rows({"instances": [{"data": b64}, {"data": b64}]}, {"x-request-id": "req-7"})
    assert [row.request_id for row in rows] == ["req-7", "req-7"]  # one HTTP request, one id


@pytest.mark.parametrize("payload,code,words", [
    ({"instances": []}, 400, "no instances"),
    ([1, 2], 400, "must be an object"),
    ({"instances": [{"image": {"b64": "%%"}}]}, 400, "not valid base64"),
    ({"instances": [{"image": {"b64": "eA=="}, "topk": 1000}]}, 400, "topk"),
    (b"", 400, "empty"),
])
def test_v1_bad_payloads_say_why(payload, code, words):
    with pytest.raises(RequestError) as raised:
        image_of(v1_rows(payload)[0])  # the adapter refuses the request's shape, request_body its image
    assert raised.value.code == code and words in raised.value.message


def test_v2_raw_bytes_survive_kserves_data_plane():
    rows = v2_rows(tritonclient_request([CAT, CAT], topk=2))
    assert [image_of(row) for row in rows] == [CAT, CAT] and requested_topk(rows[0]) == 2


def test_v2_json_elements_are_base64():
    request = InferRequest("resnet18", [InferInput("image", [1], "BYTES", [base64.b64encode(CAT).decode()])])
    assert image_of(v2_rows(request)[0]) == CAT


def test_v2_wrong_input_is_a_400_naming_what_came():
    request = InferRequest("resnet18", [InferInput("pixels", [1], "FP32", [0.5])])
    with pytest.raises(RequestError, match=r'"image".*pixels \(FP32\)'):
        v2_rows(request)


def test_one_bad_row_of_several_names_its_index():
    with pytest.raises(RequestError, match="image 1: bad") as raised:
        answered([{"predictions": []}, RequestError(415, "bad")])
    assert raised.value.code == 415


def test_v2_answer_is_the_cores_as_tensors_naming_the_model_as_served(model, resnet18_unpacked):
    headers: dict = {}
    response = asyncio.run(model.predict(tritonclient_request([CAT], topk=3), {}, headers))
    outputs = {output.name: output for output in response.outputs}
    expected = expected_answer(resnet18_unpacked, CAT, 3)
    assert response.model_name == response.parameters["model"] == "clf"
    assert response.parameters["architecture"] == "resnet18"
    assert headers == {VERSION_HEADER: model.core.version, SERVED_BY: model.here()}  # the reply every engine makes
    served = {**response.parameters, "predictions": [
        {"label": label.decode(), "index": int(index), "probability": float(p)} for label, index, p in zip(
            outputs["labels"].data[0], outputs["indices"].data[0], outputs["probabilities"].data[0])]}
    assert_same_answer(served, expected)


def test_concurrent_requests_share_a_batch(model, caplog):
    async def three_at_once():
        return await asyncio.gather(*(model.batcher.answer(v1_rows(CAT)) for _ in range(3)))

    with caplog.at_level(logging.INFO, logger="handlers.core"):
        answers = asyncio.run(three_at_once())
    assert all(a[0]["predictions"] for a in answers)
    assert "batch of 3:" in caplog.text


def test_batch_size_one_answers_at_once(model):
    unbatched = resolve_policy(Machine(0, 1), flags=PolicyChoices(batch_size=1, max_batch_delay_ms=0))
    batcher = Batcher(model.core, unbatched)
    (answer,) = asyncio.run(batcher.answer(v1_rows(CAT)))
    assert (answer["model"], answer["architecture"]) == ("clf", "resnet18")


def test_the_model_runs_and_describes_the_policy_it_was_given(model):
    assert model.core.policy == BATCHING and model.core.threads == 1
    assert model.describe()["policy"]["why"] == BATCHING.lines()
    assert (model.batcher.size, model.batcher.delay_ms) == (4, 300)


def test_a_pool_of_two_workers_answers_as_the_core_each_batch_to_the_one_free_longest(resnet18_unpacked):
    """Two spawned worker processes (serving/kserve/pool.py), each with its own core: a batch's answers and its
    rows' errors as the core in process gives them, and one caller's batches alternate between the workers."""
    two = resolve_policy(Machine(0, 2), flags=PolicyChoices(workers=2, threads_per_worker=1))
    pool = WorkerPool.open("clf", resnet18_unpacked, "cpu", None, two)
    try:
        answered = pool.run_batch(v1_rows(CAT) + v1_rows(b"not an image"))
        assert_same_answer(answered.answers[0], expected_answer(resnet18_unpacked, CAT))
        assert answered.answers[0]["model"] == pool.describe()["model"] == "clf"  # each worker's core, as served
        error = answered.answers[1]
        assert isinstance(error, RequestError) and error.code == 415 and "not an image" in error.message
        workers = [pool.run_batch(v1_rows(CAT)).worker for _ in range(4)]
        assert workers[0] == workers[2] != workers[1] == workers[3] and answered.worker in workers
        described = pool.describe()
        assert described["artifact"] == answered.answers[0]["artifact"]  # the form that answered is the one described
        assert [(w["worker"], w["rows"]) for w in described["workers"]] in ([(1, 4), (2, 2)], [(1, 2), (2, 4)])
        pids = [w["pid"] for w in described["workers"]]
    finally:
        pool.close()
    assert not any(alive(pid) for pid in pids)
