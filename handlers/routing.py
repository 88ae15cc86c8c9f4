"""One routing policy for a rollout's live traffic, the same on every engine (`python -m serving rollout`,
docs/rollout.md). While a candidate version is loaded beside the live one, the live version's workers:

- keep the photos of their next N requests (--shadow N: a Capture), the answers untouched;
- send P % of their requests to the candidate (--canary P: a CanaryShare); the client gets the candidate's answer,
  naming its version, when it served the request; when it failed (an error, a crash, no answer within
  FORWARD_TIMEOUT_S) or declined it (refused as the client's bad request), the live version answers, and the
  outcome is counted;
- send no more of the share once the candidate failed: that failure already refuses the rollout, and a candidate
  that hangs must not hold one live request after another for FORWARD_TIMEOUT_S each.

No engine splits or mirrors traffic for us, so each supplies only its transport: how the rollout's control reaches
its live workers and how one request is forwarded (TorchServe: a control file and HTTP on loopback,
handlers/routes.py; KServe: in the server process, serving/kserve/versions.py; Ray: an actor the replicas poll and a
Serve handle, serving/ray/routing.py). Here because TorchServe's handler runs from the archive, which ships
handlers/ whole.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field
from enum import Enum
from typing import Awaitable, Callable, Sequence, TypeVar

logger = logging.getLogger(__name__)

# A candidate's answer within this, or the live version answers: well under the live request's own limits
# (TorchServe's response timeout, 120 s by default; a client's REQUEST_TIMEOUT_S, 60 s, in serving/settings.py).
FORWARD_TIMEOUT_S = 15.0

Answer = TypeVar("Answer")


class Outcome(str, Enum):
    """What the candidate did with one forwarded request."""

    SERVED = "served"  # answered, naming its version: the client's answer
    FAILED = "failed"  # an error of its own, a crash, a hang: refuses the rollout
    DECLINED = "declined"  # refused as the client's bad request (the live version would refuse it too)


OUTCOMES = ("asked", *(outcome.value for outcome in Outcome))


def outcome_of_status(status: int, refused_by_model: bool = True) -> Outcome:
    """A forward's HTTP status as an outcome: a 4xx our request core gave is the client's, anything else the
    candidate's failure (a token refused, a version not loaded, a full queue, a 5xx)."""
    if status == 200:
        return Outcome.SERVED
    return Outcome.DECLINED if 400 <= status < 500 and refused_by_model else Outcome.FAILED


@dataclass
class CanaryCounts:
    """One canary's outcomes in one live worker (the switchboard sums the workers')."""

    canary_id: str | None = None
    asked: int = 0
    served: int = 0
    failed: int = 0
    declined: int = 0

    @property
    def in_flight(self) -> int:
        return self.asked - self.served - self.failed - self.declined

    def add(self, outcome: Outcome) -> None:
        setattr(self, outcome.value, getattr(self, outcome.value) + 1)

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in OUTCOMES}


def answered(counts: dict) -> bool:
    """Whether every request a canary was asked has its outcome (summed counts: its share ended cleanly)."""
    return counts["asked"] <= counts["served"] + counts["failed"] + counts["declined"]


def ended(counts: dict) -> dict:
    """A canary's counts as its end reads them: a request it holds still is one it did not answer in its time."""
    in_flight = counts["asked"] - counts["served"] - counts["failed"] - counts["declined"]
    return {**counts, "failed": counts["failed"] + max(in_flight, 0)}


def summed(reports: Sequence[dict]) -> dict[str, int]:
    return {name: sum(report.get(name, 0) for report in reports) for name in OUTCOMES}


@dataclass
class CanaryShare:
    """A canary as a live worker follows it: which requests go to the candidate, and what became of them."""

    canary_id: str
    label: str
    percent: float
    counts: CanaryCounts = field(default_factory=CanaryCounts)

    def __post_init__(self) -> None:
        self.counts.canary_id = self.canary_id

    def takes(self) -> bool:
        """Whether this request is the candidate's: its share, until the candidate failed once."""
        return not self.counts.failed and random.random() * 100 < self.percent

    def chosen(self, rows: Sequence[int]) -> list[int]:
        """The rows of a batch that go to the candidate."""
        return [row for row in rows if self.takes()]

    def asked(self, number: int = 1) -> None:
        self.counts.asked += number

    def settle(self, outcome: Outcome, request_id: str, why: object = "") -> bool:
        """The outcome counted (a failure logged); whether the candidate's answer is the client's."""
        self.counts.add(outcome)
        if outcome is Outcome.FAILED:
            logger.warning("the canary %s failed request %s (%s): the live version answers it%s", self.label,
                           request_id, why or "no reason given",
                           "; it takes no more requests" if self.counts.failed == 1 else "")
        return outcome is Outcome.SERVED

    async def answer(self, request_id: str, forward: Callable[[], Awaitable[tuple[Outcome, Answer | None]]],
                     live: Callable[[], Awaitable[Answer]]) -> Answer:
        """The candidate's answer to one request of its share, or live's (the same request) when it did not
        serve it within FORWARD_TIMEOUT_S: an error, a hang or a crash of the candidate never reaches the client."""
        self.asked()
        try:
            outcome, answer = await asyncio.wait_for(forward(), FORWARD_TIMEOUT_S)
            why: object = ""
        except asyncio.TimeoutError:
            outcome, answer, why = Outcome.FAILED, None, f"no answer within {FORWARD_TIMEOUT_S:g} s"
        except Exception as error:  # the candidate's failure, whatever it is: counted, and the live version answers
            outcome, answer, why = Outcome.FAILED, None, f"{type(error).__name__}: {error}"
        if self.settle(outcome, request_id, why) and answer is not None:
            return answer
        return await live()


class Capture:
    """The photos of the live version's next `count` requests, kept in arrival order for the shadow comparison."""

    def __init__(self, count: int):
        self.count = count
        self.kept: list[tuple[str, bytes]] = []

    @property
    def room(self) -> int:
        return max(self.count - len(self.kept), 0)

    def keep(self, photos: Sequence[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        """(request id, photo) pairs kept while there is room; those kept."""
        taken = list(photos[:self.room])
        self.kept.extend(taken)
        return taken
