"""A running Ray Serve's versions: the candidate is deployed beside the live application as an application of its
own (one replica, at /rollout/NAME/vN, for the gate only). At the switch the live replicas hand it every request
at once (the routing below, at 100 %), while Serve's own in-place update brings the live application to the
candidate's archive: Serve replaces its replicas a few at a time, each old one finishing the requests it holds
before it stops, and each new one, being the candidate's version, answers itself. Then the gate's application
goes.

--canary P and --shadow N: the live replicas, on whatever node, follow a small named actor of Serve's namespace
(serving/ray/routing.py) that this switchboard sets: each hands P % of its requests to the candidate's application
through a Serve handle (counted; one that fails is answered by the live version), or sends the photos of the next
N requests it answers to the actor. The switch and the unload end both for the name."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import requests

from handlers.metrics import MULTIPROC_ENV
from serving.auth import auth_headers
from serving.ray.cluster import join_own_cluster
from serving.ray.config import ADDRESS_FILE, NAMESPACE, SETTINGS_FILE, RaySettings, deployment_options
from serving.ray.server import with_key_file
from serving.ray.signals import with_metrics_env
from serving.rollout.candidate import Candidate, RolloutRefused
from serving.rollout.switchboard import Switchboard, answer_of
from serving.settings import REQUEST_TIMEOUT_S, ServingError
from serving.signals import METRICS_DIR

GATE_PREFIX = "/rollout"  # the candidate's route while the gate runs: /rollout/NAME/vN


class RaySwitchboard(Switchboard):
    engine = "ray"

    def __init__(self, run_dir: Path):
        super().__init__(run_dir)
        self.settings = RaySettings.read(self.run_config(SETTINGS_FILE, "Ray", "python -m serving --engine ray --detach"))
        self.connected = False
        self.new_router = False  # made by this command: the replicas have not polled it yet

    @property
    def model_store(self) -> Path:
        return Path(self.settings.model_store)

    def connect(self) -> None:
        """This process joins the server's cluster as a driver of Serve's namespace (once)."""
        if self.connected:
            return
        import ray
        address = self.settings.address or (self.run_dir.absolute() / ADDRESS_FILE).read_text().strip()
        join_own_cluster(self.run_dir)  # the server's cluster token, when it made one (--token-auth)
        ray.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING)
        self.connected = True

    def gate_app(self, name: str, label: str) -> str:
        return f"{name}.{label}"

    def url(self, name: str, label: str) -> str:
        if label == self.live(name):
            return self.settings.predictions_url(name)
        return f"{self.settings.url}{GATE_PREFIX}/{name}/{label}"

    def live(self, name: str) -> str:
        response = requests.get(f"{self.settings.predictions_url(name)}/description", timeout=REQUEST_TIMEOUT_S,
                                headers=auth_headers(self.settings))
        return answer_of(response, f"{name}'s description")["version"]

    def loaded(self, name: str) -> list[str]:
        from ray import serve
        self.connect()
        applications = serve.status().applications
        if name not in applications:
            return []
        gates = [app.split(".", 1)[1] for app in applications if app.startswith(f"{name}.v")]
        return [self.live(name), *gates]

    def deploy(self, name: str, archive: Path, app_name: str, route: str, beside: bool) -> None:
        from ray import serve

        from serving.ray.deployment import application, application_args
        from serving.ray.server import deployment_failure
        self.connect()
        policy = self.settings.policies[name]
        options = with_key_file(with_metrics_env(deployment_options(policy), self.metrics_folder()), self.settings)
        if beside:  # one replica for the gate, on no CPU of its own: the live replicas hold the node's CPUs
            options["ray_actor_options"]["num_cpus"] = 0
            options["autoscaling_config"].update(min_replicas=1, initial_replicas=1, max_replicas=1)
        app = application({**application_args(archive.absolute(), policy), "options": options})
        try:
            serve.run(app, name=app_name, route_prefix=route)
        except RuntimeError as error:
            raise RolloutRefused(f"{archive.name} cannot be deployed: {deployment_failure(app_name) or error}") from None

    def metrics_folder(self) -> Path:
        """Where the server's replicas write their metrics (serving/ray/signals.py): the new replicas too, the
        folder kept as it is."""
        return Path(os.environ.get(MULTIPROC_ENV) or self.run_dir.absolute() / METRICS_DIR)

    def load_beside(self, name: str, candidate: Candidate) -> None:
        app = self.gate_app(name, candidate.label)
        try:
            self.deploy(name, candidate.archive, app, f"{GATE_PREFIX}/{name}/{candidate.label}", beside=True)
        except RolloutRefused:
            self.unload(name, candidate.label)
            raise

    def ask(self, name: str, label: str, image: bytes, headers: dict) -> dict:
        response = requests.post(self.url(name, label), data=image, timeout=REQUEST_TIMEOUT_S,
                                 headers={"Content-Type": "image/png", **headers, **auth_headers(self.settings)})
        return answer_of(response, f"{name} {label}")

    def set_default(self, name: str, label: str) -> None:
        """The candidate's application, loaded beside, takes every request of name at once: the live replicas
        hand it all of them (a canary of 100 %; one that fails is answered by the live version), settled once each
        follows it. Then Serve's in-place update brings the live application to the candidate's archive (its new
        replicas answer themselves: they are that version) and the routing ends. No canary or capture outlives it."""
        import ray

        from contract.versions import archive_name, parse_label
        router = self.router(create=True)
        self.settle(router, name, ray.get(router.set_switch.remote(name, label)), idle=False)
        archive = self.model_store / archive_name(name, parse_label(label))
        self.deploy(name, archive, name, f"/predictions/{name}", beside=False)
        self.settle(router, name, ray.get(router.end.remote(name)), idle=False)  # the switch's counts are nobody's

    def drain_and_unload(self, name: str, label: str) -> None:
        """The old replicas drained during Serve's update; what goes is the gate's application."""
        for gate in self.loaded(name)[1:]:
            self.unload(name, gate)

    def unload(self, name: str, label: str) -> None:
        from ray import serve
        self.connect()
        self.end_routing(name)
        if self.gate_app(name, label) in serve.status().applications:
            serve.delete(self.gate_app(name, label))

    def canary(self, name: str, label: str, percent: float) -> dict:
        """Set, then settled: every live replica follows it, none still holds a canary request (so that the counts
        are final when it ends)."""
        import ray
        if percent and label not in self.loaded(name)[1:]:
            raise ServingError(f"a canary of {name} {label}: {label} is not loaded beside the live version")
        router = self.router(create=True)
        self.settle(router, name, ray.get(router.set_canary.remote(name, label, percent)))
        return ray.get(router.canary_report.remote(name))

    def capture(self, name: str, count: int) -> None:
        import ray
        router = self.router(create=True)
        self.settle(router, name, ray.get(router.set_capture.remote(name, count)))

    def captured(self, name: str) -> list[tuple[str, bytes]]:
        import ray
        return [tuple(kept) for kept in ray.get(self.router(create=True).captured.remote(name))]

    def end_routing(self, name: str) -> None:
        """No canary, no capture of name any more; waits until the live replicas know it."""
        import ray
        router = self.router(create=False)
        if router is not None:
            self.settle(router, name, ray.get(router.end.remote(name)))

    def router(self, create: bool):
        """The routing actor in Serve's namespace, made when create (detached: it outlives this command, as the
        replicas following it do; no CPU of its own), else None when there is none."""
        import ray

        from serving.ray.routing import ROUTER_NAME, Router
        self.connect()
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
