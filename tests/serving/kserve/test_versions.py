"""KServe's canary (serving/kserve/versions.py): a request the candidate fails on is counted and answered by the
live version, as TorchServe's and Ray's canaries do; the live client never sees the candidate's failure. The live
version is the session's real resnet18 archive, unpacked and loaded as our KServe server loads it."""

from __future__ import annotations

import asyncio
import base64

import pytest
from kserve.model_repository import ModelRepository

from contract.policy import ServingPolicy
from handlers.request_error import RequestError
from serving.kserve.pool import WorkerPool
from serving.kserve.versions import VersionedModel, Versions
from tests.conftest import ROOT

NAME = "resnet18"
CAT = ROOT / "examples" / "cat.jpg"
ONE_WORKER = ServingPolicy(workers=1, batch_size=1, max_batch_delay_ms=5, threads_per_worker=1, device="cpu",
                           reason="tests: one worker")


@pytest.fixture(scope="module")
def live(resnet18_unpacked) -> VersionedModel:
    model = VersionedModel(NAME, resnet18_unpacked, ONE_WORKER)
    model.load()
    return model


def predict_all(live: VersionedModel, bodies: list) -> list:
    """What KServe does with each request: the model's predict (Versions.predict decides who answers)."""
    async def run():
        return [await live.predict(body, {}, {}) for body in bodies]
    return asyncio.run(run())


def test_a_failing_canary_is_counted_and_the_live_version_answers(live, resnet18_unpacked):
    registry, versions = ModelRepository(), Versions(settings=None, make_model=None)
    registry.update(live)
    versions.adopt(live)
    broken = VersionedModel(NAME, resnet18_unpacked, ONE_WORKER)  # registered but never loaded: every predict fails
    versions.adopt(broken, "v2")
    asyncio.run(versions.canary(registry, NAME, "v2", 99.999))
    photo = {"instances": [{"image": {"b64": base64.b64encode(CAT.read_bytes()).decode()}}]}
    answers = predict_all(live, [photo] * 4)
    assert all(answer["predictions"][0]["version"] == live.version for answer in answers)  # the live version's
    report = asyncio.run(versions.canary(registry, NAME, "v2", 0))
    assert (report["asked"], report["served"], report["failed"]) == (1, 0, 1), report  # no more after its failure
    with pytest.raises(RequestError):  # a bad request is the client's: refused as it is, by either version
        predict_all(live, [{"instances": []}])


def test_a_candidates_pool_that_breaks_refuses_its_own_requests_and_leaves_the_server_serving(resnet18_unpacked):
    """A rollout's candidate (not essential) whose worker cannot be started again: its requests get a 503, the
    server process (here: this test's) is not stopped; the canary counts that as the candidate's failure."""
    pool = WorkerPool(NAME, resnet18_unpacked, "cpu", None, ONE_WORKER)
    pool.essential = False
    pool._fail("resnet18: inference worker 1 could not be started again (3 tries): no memory")
    with pytest.raises(RequestError) as refused:
        pool.run_batch([])
    assert refused.value.code == 503 and "could not be started again" in refused.value.message
