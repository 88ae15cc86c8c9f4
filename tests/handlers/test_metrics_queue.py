"""The queue stage (handlers/metrics.py) as KServe's and Ray's batcher records it (handlers/batching.py): each request's
wait from its arrival to the start of its batch, with a real core on the session's resnet18 archive."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from contract.policy import Machine, PolicyChoices, resolve_policy
from handlers import metrics
from handlers.batching import Batcher
from handlers.request import ImageRequest
from handlers.tasks import open_core
from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # the session's resnet18 export
CAT = (ROOT / "examples" / "cat.jpg").read_bytes()
DELAY_MS = 300
BATCHING = resolve_policy(Machine(0, 1), flags=PolicyChoices(batch_size=4, max_batch_delay_ms=DELAY_MS))


def queue_count_and_sum(served: metrics.ServedModel) -> tuple[float, float]:
    """The queue stage's observation count and their sum in seconds, for these labels only (other tests observe)."""
    labels = {**served.labels(), "stage": "queue"}
    found = {
        sample.name: sample.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        if family.name == "vision_stage_duration_seconds"
        for sample in family.samples
        if sample.labels == labels
    }
    return (found.get("vision_stage_duration_seconds_count", 0.0), found.get("vision_stage_duration_seconds_sum", 0.0))


def test_requests_waiting_for_their_batch_are_observed_in_the_queue_stage(resnet18_unpacked):
    """Three requests, one batch of up to four: the batch starts once the delay has passed, so each request waited
    for it (the first, at least the whole delay); one observation per request, under the core's labels."""
    core = open_core(resnet18_unpacked, "cpu", policy=BATCHING)
    batcher = Batcher(core, BATCHING)
    count_before, sum_before = queue_count_and_sum(core.served)

    async def three_at_once():
        return await asyncio.gather(*(batcher.answer([ImageRequest.of_image(CAT)]) for _ in range(3)))

    answers = asyncio.run(three_at_once())
    assert all("predictions" in answer for (answer,) in answers), answers
    count, seconds = queue_count_and_sum(core.served)
    assert count - count_before == 3
    assert seconds - sum_before >= DELAY_MS / 1000 * 0.99  # the first request's wait alone is the whole delay
