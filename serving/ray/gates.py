"""Each model's gate as the server process drives it: NAME's gate application (serving/ray/deployment.py RayGate,
a spare replica with its imports done, at GATE_PREFIX/NAME) deployed beside the live one, told which candidate
to open and when to let it go. The router actor (serving/ray/routing.py) records what each gate holds, so that a
gate replica Serve replaces opens it again; one candidate beside the live version at a time.

The version routes (serving/ray/versions.py) build on these; VersionsError is the refusal of both, with the HTTP
status its route answers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from contract.policy import ServingPolicy
from serving.auth import VERSION_ROUTES
from serving.ray.config import GATE_PREFIX, RaySettings, gate_app, gate_options
from serving.settings import ServingError

DEPLOY_FAILED = "DEPLOY_FAILED"  # Serve's status of an application whose replicas could not start
GATE_TIMEOUT_S = 120.0  # a gate's replica started (a busy machine's imports) and the candidate opened within this


class VersionsError(ServingError):
    """A version route's refusal: its HTTP status and why."""

    def __init__(self, status: int, why: str):
        super().__init__(why)
        self.status = status


class RayGates:
    """The server's gates: router(create) is the routing actor (None when there is none and not create)."""

    def __init__(self, settings: RaySettings, options_of: Callable[[ServingPolicy], dict],
                 router: Callable[[bool], Any]):
        self.settings = settings
        self.options_of = options_of  # a policy's deployment options, as the server deploys its own models
        self.router = router

    def held(self, name: str) -> str | None:
        """The version name's gate holds beside the live one (the router's record), None when none."""
        import ray
        router = self.router(False)
        holding = ray.get(router.gate_of.remote(name)) if router is not None else None
        return holding[0] if holding else None

    def require_held(self, name: str, label: str) -> None:
        if self.held(name) != label:
            raise VersionsError(404, f"{name} {label} is not loaded beside the live version")

    def open(self, name: str, label: str, archive: Path) -> None:
        """The candidate opened by name's gate (deployed now if it is not there: a server on someone else's
        cluster, or a gate deleted); refused while another version is beside the live one."""
        import ray
        held = self.held(name)
        if held not in (None, label):
            raise VersionsError(409, f"{name} {held} is loaded beside the live version: unload it first "
                                     f"(`python -m serving rollback`, or DELETE {VERSION_ROUTES}/{name}/{held})")
        self.deploy(name, wait=True)
        router = self.router(True)
        ray.get(router.set_gate.remote(name, label, str(archive)))  # first: a replaced gate replica opens it too
        try:
            held_now = self.ask(name, label, archive)
        except VersionsError:
            ray.get(router.set_gate.remote(name, None))
            raise
        if "refused" in held_now:
            ray.get(router.set_gate.remote(name, None))
            raise VersionsError(422, f"{archive.name} cannot be loaded: {held_now['refused']}")

    def release(self, name: str) -> None:
        """The gate lets its version go and stands by again."""
        import ray
        ray.get(self.router(True).set_gate.remote(name, None))
        self.ask(name, None)

    def ask(self, name: str, label: str | None, archive: Path | None = None) -> dict:
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

    def deploy(self, name: str, wait: bool) -> None:
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


def deployment_failure(name: str) -> str | None:
    """Serve's message of application name's failed deployment: the replica constructor's exception, its
    traceback cut to the last line (the core's reason, e.g. the sha256 mismatch)."""
    from ray import serve
    application = serve.status().applications.get(name)
    messages = [status.message for status in (application.deployments.values() if application else ())
                if status.message]
    lines = [line for message in messages for line in message.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else None
