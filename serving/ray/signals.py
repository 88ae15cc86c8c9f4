"""The Ray engine's signals (docs/observability.md): every replica writes its metrics (handlers/metrics.py) to the
run dir's folder, and the server process serves them on a fixed port with liveness and readiness
(serving/signals.py's server): ready when every application runs and each of its deployments is healthy with a
replica up. Replicas on other nodes write to their own node's folder: a cluster is scraped per node.
"""

from __future__ import annotations

from pathlib import Path

from handlers.metrics import MULTIPROC_ENV
from serving.front import FrontFollower
from serving.ports import Port, PortInUse, refusal
from serving.signals import metrics_env, serve_signals

RUNNING, HEALTHY = "RUNNING", "HEALTHY"
PROXY_LOGS = "session_latest/logs/serve/proxy_*.log"  # under Ray's temp dir: a line per request, its proxy's time


def metrics_folder(run_dir) -> Path:
    """The folder every replica on this machine writes its metrics to (made afresh once per start)."""
    return Path(metrics_env(run_dir)[MULTIPROC_ENV])


def with_metrics_env(options: dict, folder: Path) -> dict:
    """The deployment's options with its replicas writing their metrics to folder."""
    options["ray_actor_options"].setdefault("runtime_env", {}).setdefault("env_vars", {})[MULTIPROC_ENV] = str(folder)
    return options


def readiness(models: list[str]):
    def why_not() -> list[str]:
        from ray import serve
        applications = serve.status().applications
        missing = []
        for name in models:
            application = applications.get(name)
            if application is None or str(getattr(application.status, "value", application.status)) != RUNNING:
                missing.append(f"{name}: application {getattr(application, 'status', 'absent')}")
                continue
            for deployment, status in application.deployments.items():
                if str(getattr(status.status, "value", status.status)) != HEALTHY:
                    missing.append(f"{name}: deployment {deployment} {status.status} {status.message or ''}".strip())
        return missing
    return why_not


def start(host: str, port: int, models: list[str], folder: Path, temp_dir: Path, versions=None):
    """The signals server (with versions, their routes too: serving/ray/versions.py), and the follower of Serve's
    proxy logs under Ray's temp dir (serving/front.py: a cluster this command joined keeps its logs elsewhere, and
    its front goes unrecorded here); PortInUse where its port was taken since the engine checked it
    (serving/ports.py): the metrics address the engine prints must be this server's."""
    try:
        server = serve_signals(host, port, readiness(models), folder, versions)
    except OSError as error:
        raise PortInUse(refusal(Port("--signals-port", host, port), error)) from None
    FrontFollower(temp_dir / PROXY_LOGS, "ray", models).start()
    return server
