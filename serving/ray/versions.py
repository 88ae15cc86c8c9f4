"""Versions of a model on our Ray Serve server, held by its server process (already Serve's driver) and driven
through its version routes (serving/rollout/switchboard.py's RoutedSwitchboard), which its signals server carries:
a rollout then needs no Ray driver of its own (Python's `import ray`, `ray.init` and Serve's client: seconds
before its first step, and several times that on a loaded machine).

The candidate is opened beside the live application by NAME's gate (serving/ray/gates.py drives it; its replica,
serving/ray/deployment.py RayGate, is a spare deployed with the live one, its imports done). At the switch the
live replicas hand it every request at once (the routing below, at 100 %), while Serve's own in-place update
brings the live application to the candidate's archive: Serve replaces its replicas a few at a time, each old one
finishing the requests it holds before it stops, and each new one, being the candidate's version, answers itself.
Then the gate lets the candidate go and stands by again.

--canary P and --shadow N: the live replicas, on whatever node, follow a small named actor of Serve's namespace
(serving/ray/routing.py) that these versions set: each hands P % of its requests to the gate through a Serve
handle (counted; one that fails is answered by the live version), or sends the photos of the next
N requests it answers to the actor. The switch and the unload end both for the name."""

from __future__ import annotations

import base64
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path

import requests

from contract.policy import ServingPolicy
from contract.versions import archive_name, parse_label
from serving.auth import VERSION_ROUTES, auth_headers
from serving.ray.config import RaySettings
from serving.ray.gates import RayGates, VersionsError, deployment_failure
from serving.rollout.switchboard import answer_of
from serving.settings import REQUEST_TIMEOUT_S, ServingError

logger = logging.getLogger("serving.ray")

NAME, LABEL = r"(?P<name>[^/]+)", r"(?P<label>v\d+)"


class RayVersions:
    """The server process's view of its models' versions (it is connected to its cluster as Serve's driver)."""

    def __init__(self, settings: RaySettings, options_of: Callable[[ServingPolicy], dict]):
        self.settings = settings
        self.options_of = options_of  # a policy's deployment options, as the server deploys its own models
        self.new_router = False  # made by this process: the replicas have not polled it yet
        self.gates = RayGates(settings, options_of, self.router)

    # ---------------------------------------------------------------- what is loaded
    def describe(self, name: str) -> dict:
        import ray
        from ray import serve
        if name not in serve.status().applications:
            raise VersionsError(404, f"no model {name}")
        default = described_version(self.settings, name)
        held = self.gates.held(name)
        router = self.router(create=False)
        canary = ray.get(router.canary_report.remote(name)) if router is not None else None
        return {"default": default, "loaded": [default, *([held] if held and held != default else [])],
                "canary": canary if canary and canary["label"] else None}

    # ---------------------------------------------------------------- loading and switching
    def load(self, name: str, label: str) -> dict:
        """The candidate opened beside the live version by name's gate (serving/ray/gates.py)."""
        self.gates.open(name, label, self.archive(name, label))
        return {"loaded": label}

    def archive(self, name: str, label: str) -> Path:
        if name not in self.settings.policies:
            raise VersionsError(404, f"no model {name}")
        archive = Path(self.settings.model_store).absolute() / archive_name(name, parse_label(label))
        if not archive.is_file():
            raise VersionsError(404, f"{archive} not in the model store")
        return archive

    def deploy(self, name: str, archive: Path) -> None:
        """name's live application from archive, at the server's start or in place at a switch; returns once its
        replicas run (serve.run waits for them), VersionsError with Serve's reason when it cannot (a replica's
        constructor failing, e.g. the sha256)."""
        from ray import serve

        from serving.ray.deployment import application, application_args
        policy = self.settings.policies[name]
        options = self.options_of(policy)
        logger.info("deploying %s (%s) on %s: %s; replicas %s", name, archive.name, self.settings.url,
                    "; ".join(policy.lines()), options["autoscaling_config"])
        app = application({**application_args(archive, policy), "options": options})
        try:
            serve.run(app, name=name, route_prefix=f"/predictions/{name}")
        except RuntimeError as error:  # Serve's "Deploying application NAME failed: ...": the replica says why
            raise VersionsError(422, f"{name}: {archive.name} cannot be deployed: "
                                     f"{deployment_failure(name) or error}") from None

    def set_default(self, name: str, label: str) -> dict:
        """The candidate, held by the gate, takes every request of name at once: the live replicas hand it all of
        them (a canary of 100 %; one that fails is answered by the live version), settled once each follows it.
        Then Serve's in-place update brings the live application to the candidate's archive (its new replicas
        answer themselves: they are that version), the routing ends and the gate stands by again. No canary or
        capture outlives it."""
        import ray
        archive = self.archive(name, label)
        self.gates.require_held(name, label)
        router = self.router(create=True)
        self.settle(router, name, ray.get(router.set_switch.remote(name, label)), idle=False)
        self.deploy(name, archive)
        self.settle(router, name, ray.get(router.end.remote(name)), idle=False)  # the switch's counts are nobody's
        self.gates.release(name)
        logger.info("%s: %s is the default", name, label)
        return {"default": label}

    def unload(self, name: str, label: str) -> dict:
        """The gate lets that version go (the old version's replicas drained in Serve's update)."""
        self.end_routing(name)
        if self.gates.held(name) == label:
            self.gates.release(name)
        return {"unloaded": label}

    # ---------------------------------------------------------------- canary and capture
    def canary(self, name: str, label: str, percent: float) -> dict:
        """Set, then settled: every live replica follows it, none still holds a canary request (so that the counts
        are final when it ends)."""
        import ray
        if percent and self.gates.held(name) != label:
            raise VersionsError(409, f"a canary of {name} {label}: {label} is not loaded beside the live version")
        router = self.router(create=True)
        self.settle(router, name, ray.get(router.set_canary.remote(name, label, percent)))
        return ray.get(router.canary_report.remote(name))

    def capture(self, name: str, count: int) -> dict:
        import ray
        router = self.router(create=True)
        self.settle(router, name, ray.get(router.set_capture.remote(name, count)))
        return {"capturing": count}

    def captured(self, name: str) -> dict:
        import ray
        kept = ray.get(self.router(create=True).captured.remote(name))
        return {"captured": [{"id": request_id, "b64": base64.b64encode(photo).decode()}
                             for request_id, photo in kept]}

    def end_routing(self, name: str) -> None:
        """No canary, no capture of name any more; waits until the live replicas know it."""
        import ray
        router = self.router(create=False)
        if router is not None:
            self.settle(router, name, ray.get(router.end.remote(name)))

    def router(self, create: bool):
        """The routing actor in Serve's namespace, made when create (detached: it outlives a rollout, as the
        replicas following it do; no CPU of its own), else None when there is none."""
        import ray

        from serving.ray.routing import ROUTER_NAME, Router
        try:
            return ray.get_actor(ROUTER_NAME)
        except ValueError:
            if not create:
                return None
        self.new_router = True
        return Router.options(name=ROUTER_NAME, lifetime="detached", get_if_exists=True).remote()

    def settle(self, router, name: str, epoch: int, idle: bool = True) -> None:
        """Wait until every live replica has polled the change (and, when idle, holds no canary request), or
        SETTLE_TIMEOUT_S. A router just made knows no replica yet: their first polls come first."""
        import ray

        from serving.ray.routing import POLL_S, SETTLE_TIMEOUT_S
        if self.new_router:
            time.sleep(1.5 * POLL_S)
            self.new_router = False
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while not ray.get(router.settled.remote(name, epoch, idle)) and time.monotonic() < deadline:
            time.sleep(POLL_S / 4)

    # ---------------------------------------------------------------- the routes
    def answer(self, method: str, path: str, query: dict[str, str]) -> tuple[int, dict]:
        """(status, JSON body) of a version route (VERSION_ROUTES/...), the caller already allowed."""
        try:
            return 200, self.route(method, path.removeprefix(VERSION_ROUTES), query)
        except VersionsError as error:
            return error.status, {"detail": str(error)}
        except ServingError as error:  # a rollout's refusal among them
            return 409, {"detail": str(error)}

    def route(self, method: str, path: str, query: dict[str, str]) -> dict:
        steps = [
            ("GET", rf"/{NAME}", lambda m: self.describe(m["name"])),
            ("PUT", rf"/{NAME}/capture", lambda m: self.capture(m["name"], int(number(query, "count")))),
            ("GET", rf"/{NAME}/captured", lambda m: self.captured(m["name"])),
            ("POST", rf"/{NAME}/{LABEL}", lambda m: self.load(m["name"], m["label"])),
            ("PUT", rf"/{NAME}/{LABEL}/default", lambda m: self.set_default(m["name"], m["label"])),
            ("PUT", rf"/{NAME}/{LABEL}/canary",
             lambda m: self.canary(m["name"], m["label"], number(query, "percent"))),
            ("DELETE", rf"/{NAME}/{LABEL}", lambda m: self.unload(m["name"], m["label"])),
        ]
        for step_method, pattern, step in steps:
            matched = re.fullmatch(pattern, path)
            if matched and step_method == method:
                return step(matched)
        raise VersionsError(404, f"no version route {method} {VERSION_ROUTES}{path}")


def described_version(settings: RaySettings, name: str) -> str:
    """The live application's version, as its replicas describe it on Serve's proxy."""
    response = requests.get(f"{settings.predictions_url(name)}/description", timeout=REQUEST_TIMEOUT_S,
                            headers=auth_headers(settings))
    return answer_of(response, f"{name}'s description")["version"]


def number(query: dict[str, str], key: str) -> float:
    try:
        return float(query[key])
    except (KeyError, ValueError):
        raise VersionsError(422, f"give ?{key}=NUMBER") from None
