"""Versions of a model on our Ray Serve server, held by its server process (already Serve's driver) and driven
through its version routes (serving/rollout/switchboard.py's RoutedSwitchboard), which its signals server carries:
a rollout then needs no Ray driver of its own (Python's `import ray`, `ray.init` and Serve's client: seconds
before its first step, and several times that on a loaded machine).

The candidate is opened beside the live application by NAME's gate (serving/ray/deployment.py RayGate: a spare
replica deployed with the live one, its imports done, at GATE_PREFIX/NAME/vN once it holds vN). At the switch the
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
from serving.ray.config import GATE_PREFIX, RaySettings, gate_app, gate_options
from serving.rollout.switchboard import answer_of
from serving.settings import REQUEST_TIMEOUT_S, ServingError

logger = logging.getLogger("serving.ray")

NAME, LABEL = r"(?P<name>[^/]+)", r"(?P<label>v\d+)"
DEPLOY_FAILED = "DEPLOY_FAILED"  # Serve's status of an application whose replicas could not start
GATE_TIMEOUT_S = 120.0  # a gate's replica started (a busy machine's imports) and the candidate opened within this


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
    def describe(self, name: str) -> dict:
        import ray
        from ray import serve
        if name not in serve.status().applications:
            raise VersionsError(404, f"no model {name}")
        default = described_version(self.settings, name)
        held = self.held(name)
        router = self.router(create=False)
        canary = ray.get(router.canary_report.remote(name)) if router is not None else None
        return {"default": default, "loaded": [default, *([held] if held and held != default else [])],
                "canary": canary if canary and canary["label"] else None}

    def held(self, name: str) -> str | None:
        """The version name's gate holds beside the live one (the router's record), None when none."""
        import ray
        router = self.router(create=False)
        holding = ray.get(router.gate_of.remote(name)) if router is not None else None
        return holding[0] if holding else None

    def require_held(self, name: str, label: str) -> None:
        if self.held(name) != label:
            raise VersionsError(404, f"{name} {label} is not loaded beside the live version")

    # ---------------------------------------------------------------- loading and switching
    def load(self, name: str, label: str) -> dict:
        """The candidate opened by name's gate (deployed now if it is not there: a server on someone else's
        cluster, or a gate deleted); one version beside the live one at a time."""
        import ray
        archive = self.archive(name, label)
        held = self.held(name)
        if held not in (None, label):
            raise VersionsError(409, f"{name} {held} is loaded beside the live version: unload it first "
                                     f"(`python -m serving rollback`, or DELETE {VERSION_ROUTES}/{name}/{held})")
        self.deploy_gate(name, wait=True)
        router = self.router(create=True)
        ray.get(router.set_gate.remote(name, label, str(archive)))  # first: a replaced gate replica opens it too
        try:
            held_now = self.gate_hold(name, label, archive)
        except VersionsError:
            ray.get(router.set_gate.remote(name, None))
            raise
        if "refused" in held_now:
            ray.get(router.set_gate.remote(name, None))
            raise VersionsError(422, f"{archive.name} cannot be loaded: {held_now['refused']}")
        return {"loaded": label}

    def gate_hold(self, name: str, label: str | None, archive: Path | None = None) -> dict:
        """The gate's replica told what to hold: its answer ({"held"} or {"refused": why}); VersionsError when it
        does not answer (its replica not started within GATE_TIMEOUT_S, or failing)."""
        from ray import serve
        try:
            handle = serve.get_app_handle(gate_app(name))
            return handle.hold.remote(label, None if archive is None else str(archive)).result(
                timeout_s=GATE_TIMEOUT_S)
        except Exception as error:  # Serve's own: a timeout, a replica that died while opening
            raise VersionsError(503, f"{gate_app(name)}, which opens {name}'s candidate, did not answer: "
                                     f"{type(error).__name__}: {error}") from None

    def deploy_gate(self, name: str, wait: bool) -> None:
        """name's gate beside its live application, unless it is there (a failed one is deployed again); waited
        for when wait, else deployed while the caller goes on (the server's start, which returns once its own
        models answered)."""
        from ray import serve

        from serving.ray.deployment import gate_application
        app = gate_app(name)
        status = serve.status().applications.get(app)
        if status is not None and status.status != DEPLOY_FAILED:
            return  # running, or its replica still starting: the hold waits for it
        if status is not None:
            serve.delete(app)
        policy = self.settings.policies[name]
        target = serve.RunTarget(gate_application(name, policy, gate_options(self.options_of(policy))),
                                 name=app, route_prefix=f"{GATE_PREFIX}/{name}")
        try:
            serve.run_many([target], wait_for_applications_running=wait)
        except RuntimeError as error:  # Serve's "Deploying application ... failed": the replica says why
            raise VersionsError(503, f"{app}, which opens {name}'s candidate, cannot be deployed: "
                                     f"{deployment_failure(app) or error}") from None

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
        self.require_held(name, label)
        router = self.router(create=True)
        self.settle(router, name, ray.get(router.set_switch.remote(name, label)), idle=False)
        self.deploy(name, archive)
        self.settle(router, name, ray.get(router.end.remote(name)), idle=False)  # the switch's counts are nobody's
        self.release(name)
        logger.info("%s: %s is the default", name, label)
        return {"default": label}

    def unload(self, name: str, label: str) -> dict:
        """The gate lets that version go (the old version's replicas drained in Serve's update)."""
        self.end_routing(name)
        if self.held(name) == label:
            self.release(name)
        return {"unloaded": label}

    def release(self, name: str) -> None:
        import ray
        router = self.router(create=True)
        ray.get(router.set_gate.remote(name, None))
        self.gate_hold(name, None)

    # ---------------------------------------------------------------- canary and capture
    def canary(self, name: str, label: str, percent: float) -> dict:
        """Set, then settled: every live replica follows it, none still holds a canary request (so that the counts
        are final when it ends)."""
        import ray
        if percent and self.held(name) != label:
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
