"""The TorchServe engine (`python -m serving`, the default): TorchServe on loopback with every archive of the
model store, ready when each model has answered a real prediction.

TorchServe's /ping can answer Healthy while every worker crashes, so readiness here means: a POST of a real image
returned 200 with predictions. A worker that fails to load is caught from the logs and reported with the
handler's own error instead of waiting out the timeout.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from contract.policy import ServingPolicy
from handlers.metrics import MULTIPROC_ENV
from handlers.policy import RUN_CONFIG_ENV
from serving.auth import KeysNotWritten, auth_headers
from serving.engine import Engine, await_prediction, register
from serving.ports import Port
from serving.processes import read_pgid, stop_group
from serving.settings import EXAMPLE_IMAGE, PROBE_TIMEOUT_S, PROJECT_ROOT, STOP_TIMEOUT_S, ServingError, policies_text
from serving.signals import METRICS_DIR, metrics_env
from serving.torchserve import config as ts
from serving.torchserve.config import ServerSettings, token_auth_switched_on, write_run_config
from serving.torchserve.logs import FRONTEND_LOG, WORKER_LOG, exit_reason, load_failure

if TYPE_CHECKING:
    import requests

    from serving.rollout.switchboard import Switchboard

ACCESS_LOG = "access_log.log"  # TorchServe's line per request, its frontend's time in it (log4j2.xml)
SIGNALS_PID = "signals.pgid"  # the signals server beside TorchServe (serving/signals.py)
SIGNALS_LOG = "signals.log"
# Its settings' ports, each set by the flag of its name (inference_port: --inference-port), checked before start.
PORT_SETTINGS = ("inference_port", "management_port", "metrics_port", "signals_port", "grpc_inference_port",
                 "grpc_management_port")
SIGNALS_STOP_S = 10
SOCKET_PATH_MAX = 100  # sun_path holds 107 bytes; leave room for ".ts.sock.NNNNN"


@register
class TorchServe(Engine):
    name = "torchserve"
    title = "TorchServe"
    description = """Workers, batching and threads are decided for the machine that serves (contract/policy.py):
one batching worker per GPU; on a CPU, a worker per core (at most 4), no batching, cores / workers threads.
Token authorisation: --token-auth, or TorchServe's own switch (disable_token_authorization=false in the
config file, TS_DISABLE_TOKEN_AUTHORIZATION=false in the environment); the keys are in RUN_DIR/key_file.json."""
    settings_type = ServerSettings
    extra_actions = {"config": "write the config.properties with this machine's serving policy to --out and print "
                               "the policy"}
    retry_on = (KeysNotWritten,)  # a probe before TorchServe wrote its keys is tried again
    settings: ServerSettings
    signals: subprocess.Popen | None = None  # the signals server this process started beside TorchServe

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--out", type=Path, default=None, help="where `config` writes config.properties")
        parser.add_argument("--inference-port", type=int, default=ts.INFERENCE_PORT)
        parser.add_argument("--management-port", type=int, default=ts.MANAGEMENT_PORT)
        parser.add_argument("--metrics-port", type=int, default=ts.METRICS_PORT)
        parser.add_argument("--signals-port", type=int, default=ts.SIGNALS_PORT,
                            help="our metrics (GET /metrics) and health (/health/live, /health/ready) beside TorchServe")
        parser.add_argument("--grpc-inference-port", type=int, default=ts.GRPC_INFERENCE_PORT)
        parser.add_argument("--grpc-management-port", type=int, default=ts.GRPC_MANAGEMENT_PORT)
        parser.add_argument("--config", type=Path, default=ts.DEFAULT_CONFIG)
        parser.add_argument("--token-auth", action="store_true",
                            help="switch on TorchServe's token authorisation: clients send 'Authorization: Bearer "
                                 "KEY' with the keys TorchServe writes to RUN_DIR/key_file.json")

    @classmethod
    def own_settings(cls, args: argparse.Namespace) -> dict:
        return {**{name: getattr(args, name) for name in PORT_SETTINGS}, "config": args.config,
                "token_auth": args.token_auth}

    def run_extra_action(self, action: str, args: argparse.Namespace) -> int:
        """config: for launchers that start TorchServe themselves (the container's entrypoint)."""
        if action != "config":
            return super().run_extra_action(action, args)
        if args.out is None:
            raise ServingError("`python -m serving config` needs --out PATH for the config.properties it writes")
        from contract.files import atomic_write_text
        atomic_write_text(args.out, ts.run_config_text(self.settings))
        print(f"{args.out}: {', '.join(self.settings.served_models())}; {self.policies_said()}")
        return 0

    def launch(self) -> subprocess.Popen:
        """Whether tokens are checked is resolved here, once (--token-auth, or TorchServe's own switch in the
        config file or the environment)."""
        settings = self.settings
        settings.token_auth = token_auth_switched_on(settings, os.environ)
        for old in [*settings.log_dir.glob("*.log"), settings.key_file]:
            old.unlink(missing_ok=True)  # a previous run's key file would not open this run's server
        from handlers.routes import forget_all  # here: the request core's imports (torch) stay out of --help
        forget_all(settings.run_dir.absolute())  # a canary or capture of a rollout the last run left
        config = write_run_config(settings)
        server = self.popen(torchserve_command(settings, config), settings.log_dir / "console.log",
                            server_env(settings, config))
        self.signals = start_signals(settings, server.pid)
        (settings.run_dir.absolute() / SIGNALS_PID).write_text(str(self.signals.pid))
        return server

    def stop(self, process: subprocess.Popen | None = None, timeout: float = STOP_TIMEOUT_S) -> bool:
        """TorchServe's whole group, then the signals server beside it."""
        stopped = super().stop(process, timeout)
        stop_signals(self.settings.run_dir.absolute() / SIGNALS_PID, self.signals)
        return stopped

    def ports(self) -> list[Port]:
        """TorchServe's HTTP and gRPC ports and our signals server's, all on the settings' host."""
        settings = self.settings
        return [Port(f"--{name.replace('_', '-')}", settings.host, getattr(settings, name)) for name in PORT_SETTINGS]

    def probe(self, model: str, image: Path) -> tuple[str, Callable[[], requests.Response]]:
        url, body = self.settings.predictions_url(model), Path(image).read_bytes()
        return url, lambda: post_image(url, body, auth_headers(self.settings))

    def load_failure(self) -> str | None:
        """A worker that cannot load its model, or the signals server gone (its port taken since the check): the
        metrics address printed must be this server's."""
        return signals_exit(self.settings, self.signals) or load_failure(self.settings.log_dir)

    def log_files(self) -> list[Path]:
        return [self.settings.log_dir / name for name in (FRONTEND_LOG, WORKER_LOG)]

    def exit_reason(self) -> str:
        return exit_reason(self.settings.log_dir)

    def announcement(self) -> str:
        return (f"TorchServe starting with {', '.join(self.settings.served_models())} (logs: {self.settings.log_dir}; "
                f"policy: {self.policies_said()}); waiting for a real prediction from each model ...")

    def policies_said(self) -> str:
        policies = self.settings.model_policies()
        threads = sorted({policy.threads_per_worker for policy in policies.values()})
        return f"{policies_text(policies)}; {'/'.join(map(str, threads))} thread(s) per worker"

    def urls(self, model: str) -> dict[str, str]:
        return {"predictions": self.settings.predictions_url(model)}

    @classmethod
    def on_free_ports(cls, model_store: Path, run_dir: Path, models: Sequence[str] = (),
                      policy: ServingPolicy | None = None) -> ServerSettings:
        settings = ts.on_free_ports(model_store, run_dir)
        settings.models, settings.policy = tuple(models), policy
        return settings

    def switchboard(self) -> Switchboard:
        from serving.torchserve.switchboard import TorchServeSwitchboard
        return TorchServeSwitchboard(self.settings.run_dir)

    def curl_line(self, model: str | None = None, image: Path = EXAMPLE_IMAGE) -> str:
        try:
            shown = Path(image).resolve().relative_to(Path.cwd())
        except ValueError:  # the image is outside the working folder: show its full path
            shown = image
        settings = self.settings
        token = (f' -H "Authorization: Bearer <inference key from {settings.key_file}>"' if settings.token_auth else "")
        return (f'curl -X POST {settings.predictions_url(model)} -H "Content-Type: image/jpeg"{token} '
                f"--data-binary @{shown}")

    def metrics_url(self) -> str:
        """Ours (handlers/metrics.py); TorchServe's own ts_* metrics stay on its metrics port."""
        return f"{self.settings.signals_url}/metrics"

    def request_headers(self) -> dict:
        return auth_headers(self.settings)

    def notes(self) -> list[str]:
        if not self.settings.token_auth:
            return []
        return [f"token authorisation on: keys (inference, management) in {self.settings.key_file}; anonymous "
                "requests are refused"]


def start_signals(settings: ServerSettings, server: int) -> subprocess.Popen:
    """Our signals server (serving/signals.py) beside TorchServe, in a session of its own (a process cannot join
    another session's group): it ends by itself within a second of TorchServe's launcher (--watch)."""
    command = [sys.executable, "-m", "serving.signals", "--host", settings.host, "--port", str(settings.signals_port),
               "--management", settings.management_url, "--watch", str(server), "--models", *settings.served_models(),
               "--access-log", str((settings.log_dir / ACCESS_LOG).absolute())]
    if settings.token_auth:
        command += ["--key-file", str(settings.key_file)]
    with open(settings.log_dir / SIGNALS_LOG, "ab") as output:
        env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT),
               MULTIPROC_ENV: str(settings.run_dir.absolute() / METRICS_DIR)}  # server_env made it afresh
        return subprocess.Popen(command, cwd=settings.run_dir.absolute(), env=env,
                                stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def signals_exit(settings: ServerSettings, process: subprocess.Popen | None) -> str | None:
    """Why the signals server this process started has exited (the end of its log), or None while it runs."""
    if process is None or process.poll() is None:
        return None
    lines = (settings.log_dir / SIGNALS_LOG).read_text(errors="replace").strip().splitlines()
    return (f"the signals server for port {settings.signals_port} (--signals-port) exited with code "
            f"{process.returncode}: {lines[-1] if lines else 'no log'}")


def stop_signals(pid_file: Path, process: subprocess.Popen | None) -> None:
    """The signals server's group (it leads its own session), reaped when this process started it."""
    if process is not None or read_pgid(pid_file) is not None:
        stop_group(pid_file, process, SIGNALS_STOP_S, "the signals server")
    pid_file.unlink(missing_ok=True)


def torchserve_command(settings: ServerSettings, config: Path) -> list[str]:
    """TorchServe's launcher run by this Python (`-m ts.model_server`, what the `torchserve` script calls): its
    workers run the same Python, and packages installed without their scripts (`pip install --target`, a
    virtual environment not activated) still serve."""
    if importlib.util.find_spec("ts") is None:
        raise ServingError("torchserve is not installed: pip install -e '.[serving]' (see README)")
    return [sys.executable, "-m", "ts.model_server", "--start", "--foreground", "--ncs",
            "--ts-config", str(Path(config).absolute()),
            "--model-store", str(Path(settings.model_store).absolute())]  # models: load_models in the config


def java_temp_dir(run_dir: Path) -> Path:
    folder = run_dir / "tmp"
    if len(str(folder)) + len("/.ts.sock.65535") > SOCKET_PATH_MAX:
        folder = Path(tempfile.gettempdir()) / f"ts-{hashlib.sha1(str(run_dir).encode()).hexdigest()[:12]}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def server_env(settings: ServerSettings, run_config: Path) -> dict:
    run_dir = settings.run_dir.absolute()
    return {
        **os.environ,
        RUN_CONFIG_ENV: str(run_config),  # workers inherit it: the handler reads its model's policy there
        **metrics_env(run_dir),  # every worker writes its metrics there; the signals server reads them all
        "TS_INFERENCE_ADDRESS": settings.inference_url,
        "TS_MANAGEMENT_ADDRESS": settings.management_url,
        "TS_METRICS_ADDRESS": settings.metrics_url,
        "LOG_LOCATION": str(settings.log_dir),
        "METRICS_LOCATION": str(settings.log_dir),
        "TS_GRPC_INFERENCE_PORT": str(settings.grpc_inference_port),
        "TS_GRPC_MANAGEMENT_PORT": str(settings.grpc_management_port),
        # TorchServe's launcher keeps a global pid file in TMPDIR and passes TEMP to Java as java.io.tmpdir,
        # where workers' unix sockets (.ts.sock.9000) and unpacked models live: a folder per run dir lets
        # two servers share a machine.
        "TMPDIR": str(run_dir),
        "TEMP": str(java_temp_dir(run_dir)),
        **settings.extra_env,
    }


def post_image(url: str, body: bytes, headers: dict) -> requests.Response:
    import requests
    return requests.post(url, data=body, timeout=PROBE_TIMEOUT_S, headers={"Content-Type": "image/jpeg", **headers})


def poll_for_prediction(url: str, body: bytes, headers: Callable[[], dict], deadline: float,
                        process: subprocess.Popen | None, log_dir: Path) -> dict:
    """The readiness loop for a TorchServe this process did not start (the container's entrypoint): POST the
    image to url until it answers 200 (its JSON returned). headers() is asked each time (keys appear once
    TorchServe has written them); process is what must stay alive, log_dir where TorchServe's logs say why."""
    return await_prediction(url, lambda: post_image(url, body, headers()), deadline, process, TorchServe.title,
                            lambda: exit_reason(log_dir), lambda: load_failure(log_dir), TorchServe.retry_on).json()
