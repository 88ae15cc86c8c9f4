"""Versions of a model on our Ray Serve server, held by its server process (already Serve's driver) and driven
through its version routes (serving/rollout/switchboard.py's RoutedSwitchboard), which its signals server carries:
a rollout then needs no Ray driver of its own (Python's `import ray`, `ray.init` and Serve's client: seconds
before its first step, and several times that on a loaded machine).

The candidate is deployed beside the live application as an application of its own (one replica, at
/rollout/NAME/vN, for the gate only). At the switch the live replicas hand it every request at once (the routing
below, at 100 %), while Serve's own in-place update brings the live application to the candidate's archive: Serve
replaces its replicas a few at a time, each old one finishing the requests it holds before it stops, and each new
one, being the candidate's version, answers itself. Then the gate's application goes.

--canary P and --shadow N: the live replicas, on whatever node, follow a small named actor of Serve's namespace
(serving/ray/routing.py) that these versions set: each hands P % of its requests to the candidate's application
through a Serve handle (counted; one that fails is answered by the live version), or sends the photos of the next
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
from serving.rollout.switchboard import answer_of
from serving.settings import REQUEST_TIMEOUT_S, ServingError

logger = logging.getLogger("serving.ray")

GATE_PREFIX = "/rollout"  # the candidate's route on Serve's proxy while the gate runs: /rollout/NAME/vN
NAME, LABEL = r"(?P<name>[^/]+)", r"(?P<label>v\d+)"


class VersionsError(ServingError):
    """A version route's refusal: its HTTP status and why."""

    def __init__(self, status: int, why: str):
        super().__init__(why)
        self.status = status


class RayVersions:
    """The server process's view of its models' versions (it is connected to its cluster as Serve's driver)."""

    def __init__(self, settings: RaySettings, options_of: Callable[[ServingPolicy], dict]):
        self.settings = settings
        self.options_of = options_of  # a policy's deployment options, as the server deploys its own models
        self.new_router = False  # made by this process: the replicas have not polled it yet

    # ---------------------------------------------------------------- what is loaded
    def gate_app(self, name: str, label: str) -> str:
        return f"{name}.{label}"

    def describe(self, name: str) -> dict:
        import ray
        from ray import serve
        applications = serve.status().applications
        if name not in applications:
            raise VersionsError(404, f"no model {name}")
        default = described_version(self.settings, name)
        gates = [app.split(".", 1)[1] for app in applications if app.startswith(f"{name}.v")]
        router = self.router(create=False)
        canary = ray.get(router.canary_report.remote(name)) if router is not None else None
        return {"default": default, "loaded": [default, *(gate for gate in gates if gate != default)],
                "canary": canary if canary and canary["label"] else None}

    # ---------------------------------------------------------------- loading and switching
    def load(self, name: str, label: str) -> dict:
        archive = self.archive(name, label)
        app = self.gate_app(name, label)
        try:
            self.deploy(name, archive, app, f"{GATE_PREFIX}/{name}/{label}", beside=True)
        except VersionsError:
            self.unload(name, label)
            raise
        return {"loaded": label}

    def archive(self, name: str, label: str) -> Path:
        if name not in self.settings.policies:
            raise VersionsError(404, f"no model {name}")
        archive = Path(self.settings.model_store).absolute() / archive_name(name, parse_label(label))
        if not archive.is_file():
            raise VersionsError(404, f"{archive} not in the model store")
        return archive

    def deploy(self, name: str, archive: Path, app_name: str, route: str, beside: bool) -> None:
        from ray import serve

        from serving.ray.deployment import application, application_args
        policy = self.settings.policies[name]
        options = self.options_of(policy)
        if beside:  # one replica for the gate, on no CPU of its own: the live replicas hold the node's CPUs
            options["ray_actor_options"]["num_cpus"] = 0
            options["autoscaling_config"].update(min_replicas=1, initial_replicas=1, max_replicas=1)
        app = application({**application_args(archive, policy), "options": options})
        try:
            serve.run(app, name=app_name, route_prefix=route)
        except RuntimeError as error:
            raise VersionsError(422, f"{archive.name} cannot be deployed: {deployment_failure(app_name) or error}") \
                from None

    def set_default(self, name: str, label: str) -> dict:
        """The candidate's application, loaded beside, takes every request of name at once: the live replicas
        hand it all of them (a canary of 100 %; one that fails is answered by the live version), settled once each
        follows it. Then Serve's in-place update brings the live application to the candidate's archive (its new
        replicas answer themselves: they are that version), the routing ends and the gate's application goes. No
        canary or capture outlives it."""
        import ray
        from ray import serve
        archive = self.archive(name, label)
        if self.gate_app(name, label) not in serve.status().applications:
            raise VersionsError(404, f"{name} {label} is not loaded")
        router = self.router(create=True)
        self.settle(router, name, ray.get(router.set_switch.remote(name, label)), idle=False)
        self.deploy(name, archive, name, f"/predictions/{name}", beside=False)
        self.settle(router, name, ray.get(router.end.remote(name)), idle=False)  # the switch's counts are nobody's
        serve.delete(self.gate_app(name, label))
        logger.info("%s: %s is the default", name, label)
        return {"default": label}

    def unload(self, name: str, label: str) -> dict:
        """The gate's application of that version gone (the old version's replicas drained in Serve's update)."""
        from ray import serve
        self.end_routing(name)
        if self.gate_app(name, label) in serve.status().applications:
            serve.delete(self.gate_app(name, label))
        return {"unloaded": label}

    # ---------------------------------------------------------------- canary and capture
    def canary(self, name: str, label: str, percent: float) -> dict:
        """Set, then settled: every live replica follows it, none still holds a canary request (so that the counts
        are final when it ends)."""
        import ray
        from ray import serve
        if percent and self.gate_app(name, label) not in serve.status().applications:
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


def deployment_failure(name: str) -> str | None:
    """Serve's message of application name's failed deployment: the replica constructor's exception, its
    traceback cut to the last line (the core's reason, e.g. the sha256 mismatch)."""
    from ray import serve
    application = serve.status().applications.get(name)
    messages = [status.message for status in (application.deployments.values() if application else ())
                if status.message]
    lines = [line for message in messages for line in message.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else None


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
