"""How a Ray Serve engine of ours is configured: the shared serving settings (serving/settings.py), Serve's HTTP
port, the cluster it joins (or the head node it starts), written to one JSON file, its run config, that the server
process reads with each model's policy as resolved here; and what a serving policy becomes in Ray
(deployment_options)."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from contract.policy import ServingPolicy
from serving.settings import ServingSettings

SIGNALS_PORT = 8002  # our metrics and health beside Serve's 8000 (serving/ray/signals.py)

HTTP_PORT = 8000  # Ray Serve's default (ray.serve.config.DEFAULT_HTTP_PORT)
SETTINGS_FILE = "ray-settings.json"
LOG_FILE = "ray-serve.log"
ADDRESS_FILE = "ray-address"  # our own head node's GCS address: what a further node's `ray start --address` takes
REFUSAL = "REFUSING TO SERVE:"  # the line the server process logs with the reason a model cannot be served
NAMESPACE = "serve"  # Serve's own namespace: `serve status` and the Serve API of a cluster find our applications
# A rollout's candidate is served beside NAME's live application by NAME's gate application (a spare replica,
# its imports done, that opens the version loaded beside: serving/ray/deployment.py RayGate), at GATE_PREFIX/NAME/vN.
GATE_PREFIX = "/rollout"
TEMP_DIR = "ray"  # Ray's session folder (its own logs, sockets), in the run dir
# Ray puts its Unix sockets under the temp dir (…/session_<date>_<pid>/sockets/plasma_store) and a socket path
# may not exceed 107 bytes: a longer run dir gets a short folder under /tmp, linked from the run dir.
MAX_TEMP_DIR_CHARS = 40
# The object store holds only what Serve passes between its actors (no tensors travel through it); Ray's
# default reserves 30 % of the memory of every node.
OBJECT_STORE_BYTES = 100 * 2**20


@dataclass
class RaySettings(ServingSettings):
    http_port: int = HTTP_PORT
    signals_port: int = SIGNALS_PORT  # our metrics and health, served by the server process
    address: str | None = None  # an existing cluster's GCS address (HOST:PORT); None: a head node of our own
    gcs_port: int = 0  # our head node's GCS port; 0: a free one

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def signals_url(self) -> str:
        return f"http://{self.host}:{self.signals_port}"

    def predictions_url(self, model: str) -> str:
        return f"{self.url}/predictions/{model}"

    @property
    def log_file(self) -> Path:
        return self.log_dir / LOG_FILE

    @property
    def address_file(self) -> Path:
        return self.run_dir.absolute() / ADDRESS_FILE

    def temp_dir(self) -> Path:
        """Ray's temp dir: RUN_DIR/ray, or a link there to a short folder when the run dir's path is long (one
        per run dir, named by its path, so that restarts reuse it)."""
        link = self.run_dir.absolute() / TEMP_DIR
        if len(str(link)) <= MAX_TEMP_DIR_CHARS:
            return link
        if not link.is_symlink():
            short = Path(tempfile.gettempdir()) / f"ray-{hashlib.sha1(str(link).encode()).hexdigest()[:12]}"
            short.mkdir(exist_ok=True)
            link.symlink_to(short)
        return link.resolve()

    def remove_short_temp_dir(self) -> None:
        """The short folder temp_dir() linked, removed once our own node has stopped (Ray's session logs in it
        go too: ours are in the run dir's logs)."""
        link = self.run_dir.absolute() / TEMP_DIR
        if link.is_symlink():
            shutil.rmtree(link.resolve())
            link.unlink()

    def write(self) -> Path:
        """The run config the server process reads, each model's policy resolved here."""
        return self.write_file(SETTINGS_FILE)


# Serve's autoscaler, for replicas that load in seconds (an archive's artifact opens in ~1-5 s on a CPU): Ray's
# defaults (a scale-up 30 s after the queue grew, a scale-down after 10 idle minutes) suit replicas that load
# for minutes. Ours add a replica 10 s into an overload and give one back after a minute below target, judged
# on the last 15 s of load that replicas report every 2 s (`python -m measure ray-autoscale` shows both steps).
# (Ray 2.60 wants the look-back longer than the deprecated metrics_interval_s, 10 s unless set.)
AUTOSCALING_PACE = {"upscale_delay_s": 10.0, "downscale_delay_s": 60.0, "look_back_period_s": 15.0}
# How often a replica reports its load: Ray 2.60 deprecates the config's metrics_interval_s for this variable of
# the replica's environment (default 10 s).
REPLICA_ENV = {"RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "2"}
# How often Serve asks each replica whether it is alive: a replica whose process died is seen (its deployment
# UNHEALTHY, our readiness 503, a replacement started) at the next check; Ray's default is 10 s.
HEALTH_CHECK_PERIOD_S = 2.0


def gate_app(name: str) -> str:
    """The Serve application of name's gate (its candidate's replica); Serve titles the replica's process with it."""
    return f"{name}.gate"


def deployment_options(policy: ServingPolicy) -> dict:
    """The policy as Serve's deployment options. A replica is a policy worker: its CPUs are the worker's threads
    (its GPU, on a GPU machine). It takes up to two batches at once, one in the core and the next gathering:
    more would queue inside a busy replica instead of in the proxy, which can route them to an idle one.
    The autoscaler keeps one batch per replica in flight, between one replica and the policy's workers, at
    AUTOSCALING_PACE, with replicas reporting their load as REPLICA_ENV says."""
    actor = {"num_cpus": policy.threads_per_worker, "runtime_env": {"env_vars": dict(REPLICA_ENV)}}
    if policy.device == "gpu":
        actor["num_gpus"] = 1
    return {"ray_actor_options": actor, "max_ongoing_requests": 2 * policy.batch_size,
            "health_check_period_s": HEALTH_CHECK_PERIOD_S,
            "autoscaling_config": {"min_replicas": 1, "initial_replicas": policy.workers,
                                   "max_replicas": policy.workers, "target_ongoing_requests": policy.batch_size,
                                   **AUTOSCALING_PACE}}


def gate_options(options: dict) -> dict:
    """A model's deployment options as its gate's: one replica, on no CPU of its own (the live replicas hold the
    node's CPUs; the gate's photos and a canary's share are all a candidate answers)."""
    gate = {**options, "ray_actor_options": {**options["ray_actor_options"], "num_cpus": 0}}
    gate["autoscaling_config"] = {**options["autoscaling_config"], "min_replicas": 1, "initial_replicas": 1,
                                  "max_replicas": 1}
    return gate


def head_cpus(policies: dict[str, ServingPolicy], cores: int) -> int:
    """The CPUs our own head node offers Ray: the machine's cores, as `ray start` offers by default, or what every
    model's replicas ask for together when that is more: each model's policy is sized for the whole machine (as
    TorchServe and KServe start every model's workers), so a store of several models would otherwise leave the
    last ones' replicas waiting for CPUs Ray will never have, and never ready."""
    return max(cores, sum(policy.workers * policy.threads_per_worker for policy in policies.values()))
