"""Where a live Ray Serve application's requests go during a rollout (`--canary P`, `--shadow N`): one small named
actor in Serve's namespace (Router, no CPU of its own) holds per model name the canary (the candidate's label, its
share) and the capture (how many live requests' photos to keep, and those kept). The rollout's switchboard
(serving/ray/switchboard.py) sets it; each live replica, on whatever node, polls it in the background about once a second
(LiveRouting: never a remote call per request), sends its canary counts with each poll, and sends the photos it
captures to it without waiting for an answer. A canary request goes from the live replica through a Serve handle
to the name's gate (serving/ray/deployment.py RayGate), whose replica answers it with the same code as its HTTP
route. The router also records which version each gate holds, so that a gate replica Serve replaces opens it
again. What is forwarded, counted and answered by whom is the one routing policy's (handlers/routing.py): this
module is its transport on Ray.

Every change bumps the name's epoch; a change is settled once every replica that polled lately has polled again
having seen it, with no canary request in flight: the switchboard waits for that, so that a canary's counts are
final and each version then answers its own requests."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import ray

from handlers.request import ImageRequest
from handlers.request_body import image_of
from handlers.routing import CanaryShare, Capture, Outcome, ended, outcome_of_status, summed
from serving.ray.config import NAMESPACE, gate_app  # Serve's namespace: its replicas and the router live there

logger = logging.getLogger("serving.ray")

ROUTER_NAME = "vision-rollout-routing"  # the actor's name in Serve's namespace
POLL_S = 0.25  # how often a live replica asks the router where its requests go (a call to a small actor)
STALE_S = 5.0  # a replica silent for this long is gone: a change does not wait for it
SETTLE_TIMEOUT_S = 60.0  # a change reaches every live replica, and their canary requests finish, within this
NO_ROUTES = {"epoch": 0, "canary": None, "capture": None}


@dataclass
class Route:
    """One name's routing: the canary (its id changes with each new canary; its counts are per id) and the
    capture; replicas: what each live replica reported at its last poll."""

    epoch: int = 0
    canary: dict | None = None  # {"id", "label", "percent"}; percent 0 once ended (its counts still arrive)
    capture: Capture | None = None  # the photos of the next requests kept (handlers/routing.py)
    capture_id: int = 0  # which capture a replica's photo was sent for: one sent for an earlier one is not kept
    replicas: dict = field(default_factory=dict)  # replica id -> (time of its last poll, its report)

    def routes(self) -> dict:
        capturing = {"id": self.capture_id, "count": self.capture.count} if self.capture and self.capture.room else None
        return {"epoch": self.epoch, "canary": self.canary, "capture": capturing}

    def live_reports(self) -> list[dict]:
        now = time.monotonic()
        return [report for polled, report in self.replicas.values() if now - polled < STALE_S]


class RoutingTable:
    """The router's state and methods (Router is this class as a Ray actor)."""

    def __init__(self):
        self.names: dict[str, Route] = {}
        self.gates: dict[str, tuple[str, str]] = {}  # name -> (label, archive) its gate holds

    def set_gate(self, name: str, label: str | None, archive: str | None = None) -> None:
        """What name's gate holds from now on: that version (label, its archive's path), or nothing (None)."""
        if label is None:
            self.gates.pop(name, None)
        else:
            self.gates[name] = (label, str(archive))

    def gate_of(self, name: str) -> tuple[str, str] | None:
        return self.gates.get(name)

    def poll(self, name: str, replica: str, report: dict) -> dict:
        """A live replica's report (the epoch it serves by, its canary counts) and where its requests go now."""
        route = self.names.get(name)
        if route is None:
            return NO_ROUTES
        route.replicas[replica] = (time.monotonic(), report)
        return route.routes()

    def set_canary(self, name: str, label: str, percent: float) -> int:
        route = self.names.setdefault(name, Route())
        previous = route.canary
        same = previous is not None and previous["label"] == label and percent == 0
        route.canary = {"id": previous["id"] if same else route.epoch + 1, "label": label, "percent": percent}
        route.epoch += 1
        return route.epoch

    def set_switch(self, name: str, label: str) -> int:
        """Every request of name to label, at once: a canary of 100 % (its counts per id, as any canary's); no
        capture. A replica that is label's (the live application updated to it) answers its requests itself."""
        self.names.setdefault(name, Route()).capture = None
        return self.set_canary(name, label, 100)

    def leave(self, name: str, replica: str) -> None:
        """A replica stopping (Serve's shutdown hook): no change waits for it any more."""
        route = self.names.get(name)
        if route is not None:
            route.replicas.pop(replica, None)

    def set_capture(self, name: str, count: int) -> int:
        route = self.names.setdefault(name, Route())
        route.capture = Capture(count) if count > 0 else None
        route.capture_id = route.epoch + 1
        route.epoch += 1
        return route.epoch

    def keep(self, name: str, capture: int, request_id: str, photo: bytes) -> None:
        route = self.names.get(name)
        if route and route.capture and route.capture_id == capture:
            route.capture.keep([(request_id, photo)])

    def captured(self, name: str) -> list:
        route = self.names.get(name)
        return list(route.capture.kept) if route and route.capture else []

    def settled(self, name: str, epoch: int, idle: bool = True) -> bool:
        """Every live replica has polled having seen epoch and, when idle, holds no canary request (a switch's
        canary of 100 % always holds some under load: it needs only to be followed)."""
        route = self.names.get(name)
        return route is None or all(report["epoch"] >= epoch and not (idle and report["in_flight"])
                                    for report in route.live_reports())

    def canary_report(self, name: str) -> dict:
        """The canary's counts over the live replicas; a request still in flight counts as failed."""
        route = self.names.get(name)
        canary = route.canary if route else None
        if canary is None:
            return {"label": None, "percent": 0, **summed([])}
        counts = summed([report for report in route.live_reports() if report["canary"] == canary["id"]])
        return {"label": canary["label"], "percent": canary["percent"], **ended(counts)}

    def end(self, name: str) -> int:
        """No canary, no capture for name any more (its replicas learn it at their next poll)."""
        route = self.names.get(name)
        if route is None:
            return 0
        route.canary, route.capture = None, None
        route.epoch += 1
        return route.epoch


Router = ray.remote(num_cpus=0)(RoutingTable)


class LiveRouting:
    """A live replica's view of its name's routing, refreshed in the background (start() on the replica's event
    loop); the per-request checks read it only."""

    def __init__(self, name: str, replica: str, version: str):
        self.name, self.replica = name, replica
        self.version = version  # this replica's own: a canary of it (a switch to it) is answered here
        self.routes: dict = NO_ROUTES
        self.router = None
        self.handle = None  # the Serve handle of name's gate, which holds the candidate
        self.share: CanaryShare | None = None  # the canary this replica follows, and its counts
        self.sent = 0  # photos sent to the current capture: no more than its count
        self.task: asyncio.Task | None = None

    def report(self) -> dict:
        """What the router hears at each poll: the epoch this replica routes by, its canary's counts."""
        counts = self.share.counts if self.share else None
        return {"epoch": self.routes["epoch"], "canary": self.share and self.share.canary_id,
                **(counts.as_dict() if counts else summed([])), "in_flight": counts.in_flight if counts else 0}

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.poll_forever())

    def leave(self) -> None:
        """Told to the router as this replica stops (not waited for)."""
        if self.router is not None:
            self.router.leave.remote(self.name, self.replica)

    async def poll_forever(self) -> None:
        while True:
            try:
                await self.poll()
            except Exception as error:  # the router gone (or failing): nothing is routed until it answers again
                logger.warning("rollout routing of %s unavailable: %s", self.name, error)
                self.router, self.routes = None, NO_ROUTES
            await asyncio.sleep(POLL_S)

    async def poll(self) -> None:
        if self.router is None:
            try:
                self.router = await asyncio.to_thread(ray.get_actor, ROUTER_NAME, NAMESPACE)
            except ValueError:  # no rollout has made the router yet: nothing is routed
                return
        routes = await self.router.poll.remote(self.name, self.replica, self.report())
        canary = routes["canary"]
        if canary and canary["label"] == self.version:
            canary = routes["canary"] = None  # the version switched to: this replica is it
        if canary and canary["percent"] > 0 and self.handle is None:
            self.handle = await asyncio.to_thread(gate_handle, self.name)
        if canary is None:
            self.share = None
        elif self.share is None or self.share.canary_id != canary["id"]:
            self.share = CanaryShare(canary["id"], canary["label"], canary["percent"])
        else:
            self.share.percent = canary["percent"]  # 0 once ended: its counts still go to the router
        if routes["capture"] != self.routes["capture"]:
            self.sent = 0
        self.routes = routes

    def canary_handle(self):
        """The gate's handle when this request is one of the canary's share, else None."""
        canary, share = self.routes["canary"], self.share
        if canary is None or share is None or not share.takes():
            return None
        return self.handle

    async def forward(self, handle, request: ImageRequest) -> tuple | None:
        """The candidate's answer to request ((payload, code, headers)), counted; None when it did not serve it
        (failed, hung, declined): the live version answers instead."""
        share = self.share  # a new canary's counts start afresh; this request stays in its own
        if share is None:
            return None

        async def ask() -> tuple[Outcome, tuple]:
            answer = await awaited(handle.answer_as.remote(share.label, request))
            return outcome_of_status(answer[1]), answer

        async def live() -> None:
            return None
        return await share.answer(request.request_id, ask, live)

    def capture(self, request: ImageRequest) -> None:
        """The request's photo sent to the router when a capture is on (not waited for)."""
        capture = self.routes["capture"]
        if capture is None or self.router is None or self.sent >= capture["count"]:
            return
        self.sent += 1
        self.router.keep.remote(self.name, capture["id"], request.request_id, image_of(request))


async def awaited(response):
    return await response


def gate_handle(name: str):
    """A handle to name's gate, which holds the candidate (deployed beside the live application)."""
    from ray import serve
    return serve.get_app_handle(gate_app(name))


def gate_holding(name: str) -> tuple[str, str] | None:
    """(label, archive) that name's gate holds, as the router says; None with no router (no rollout yet)."""
    try:
        router = ray.get_actor(ROUTER_NAME, NAMESPACE)
    except ValueError:
        return None
    return ray.get(router.gate_of.remote(name), timeout=SETTLE_TIMEOUT_S)
