"""The one routing policy every engine follows during a rollout (handlers/routing.py): the canary's share, its
counts, the live version answering whatever the candidate does (fails, hangs, declines), the capture's room. Each
engine's transport is tested for delivery beside its own code (tests/handlers/test_routes.py, the KServe and Ray
e2e rollouts)."""

from __future__ import annotations

import asyncio
import time

from handlers import routing
from handlers.routing import CanaryShare, Capture, Outcome, answered, ended, outcome_of_status, summed


def share(percent: float = 100) -> CanaryShare:
    return CanaryShare("c1", "v2", percent)


async def live() -> str:
    return "live's answer"


def run(share_: CanaryShare, forward) -> str:
    return asyncio.run(share_.answer("req-1", forward, live))


def test_a_served_request_is_the_candidates_answer_and_counted():
    async def served():
        return Outcome.SERVED, "v2's answer"
    canary = share()
    assert run(canary, served) == "v2's answer"
    assert canary.counts.as_dict() == {"asked": 1, "served": 1, "failed": 0, "declined": 0}


def test_a_declined_request_is_answered_by_the_live_version_and_is_no_failure():
    async def declined():
        return Outcome.DECLINED, None
    canary = share()
    assert run(canary, declined) == "live's answer"
    assert (canary.counts.declined, canary.counts.failed) == (1, 0) and canary.takes()


def test_a_candidate_that_raises_is_counted_failed_answered_live_and_given_no_more(caplog):
    async def raises():
        raise ConnectionResetError("the candidate's worker died")
    canary = share()
    assert run(canary, raises) == "live's answer"
    assert canary.counts.as_dict() == {"asked": 1, "served": 0, "failed": 1, "declined": 0}
    assert not any(canary.takes() for _ in range(100))  # its failure refuses the rollout: no live request waits on it
    assert "ConnectionResetError: the candidate's worker died" in caplog.text
    assert "takes no more requests" in caplog.text


def test_a_candidate_that_hangs_is_cut_off_at_the_forward_timeout(monkeypatch):
    monkeypatch.setattr(routing, "FORWARD_TIMEOUT_S", 0.2)

    async def hangs():
        await asyncio.sleep(60)
        return Outcome.SERVED, "too late"
    canary = share()
    started = time.monotonic()
    assert run(canary, hangs) == "live's answer"
    assert time.monotonic() - started < 5 and canary.counts.failed == 1 and canary.counts.in_flight == 0


def test_the_share_is_the_percent_asked():
    assert not any(share(0).takes() for _ in range(200))
    assert all(share(100).takes() for _ in range(200))
    taken = sum(share(30).takes() for _ in range(4000))
    assert 900 < taken < 1500  # 30 % of 4000, well outside chance's reach


def test_a_statuses_outcome():
    assert outcome_of_status(200) is Outcome.SERVED
    assert outcome_of_status(415, refused_by_model=True) is Outcome.DECLINED
    assert outcome_of_status(400, refused_by_model=False) is Outcome.FAILED  # a token refused: TorchServe's, not ours
    assert outcome_of_status(503) is Outcome.FAILED


def test_counts_are_summed_and_answered_once_every_asked_request_has_an_outcome():
    first = {"asked": 3, "served": 2, "failed": 1, "declined": 0}
    second = {"asked": 2, "served": 1, "failed": 0, "declined": 0}
    total = summed([first, second])
    assert total == {"asked": 5, "served": 3, "failed": 1, "declined": 0} and not answered(total)
    assert answered(summed([first]))
    assert ended(total) == {"asked": 5, "served": 3, "failed": 2, "declined": 0}  # one still held: not answered


def test_a_capture_keeps_the_next_photos_up_to_its_count():
    capture = Capture(3)
    assert capture.keep([("a", b"1"), ("b", b"2")]) == [("a", b"1"), ("b", b"2")]
    assert capture.keep([("c", b"3"), ("d", b"4")]) == [("c", b"3")] and capture.room == 0
    assert capture.keep([("e", b"5")]) == [] and [rid for rid, _ in capture.kept] == ["a", "b", "c"]

