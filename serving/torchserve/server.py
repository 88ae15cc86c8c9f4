"""Start TorchServe on loopback, wait for a real prediction, and stop it cleanly.

TorchServe's /ping can answer Healthy while every worker crashes, so readiness here means: a POST of a
real image returned 200 with predictions. A worker that fails to load is caught from the logs and
reported with the handler's own error instead of waiting out the timeout.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from contract.errors import VisionExportError
from handlers.policy import THREADS_ENV, ServingPolicy
from serving.processes import NoAnswer, alive, poll_for_answer, read_pgid, running_until_exit, stop_group

# Settings, ports and timeouts live in config.py; free_port and on_free_ports are also reached through `server`.
from serving.torchserve.config import (  # noqa: F401
    EXAMPLE_IMAGE,
    PROBE_TIMEOUT_S,
    READY_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    STOP_TIMEOUT_S,
    ServerSettings,
    ServingError,
    free_port,
    on_free_ports,
    token_auth_switched_on,
    write_run_config,
)
from serving.torchserve.logs import exit_reason, load_failure

PID_FILE = "torchserve.pgid"


def torchserve_command(settings: ServerSettings, config: Path) -> list[str]:
    executable = shutil.which("torchserve", path=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    if not executable:
        raise ServingError("torchserve is not installed: pip install -e '.[serving]' (see README)")
    return [executable, "--start", "--foreground", "--ncs",
            "--ts-config", str(Path(config).absolute()),
            "--model-store", str(Path(settings.model_store).absolute())]  # models: load_models in the config


SOCKET_PATH_MAX = 100  # sun_path holds 107 bytes; leave room for ".ts.sock.NNNNN"


def java_temp_dir(run_dir: Path) -> Path:
    folder = run_dir / "tmp"
    if len(str(folder)) + len("/.ts.sock.65535") > SOCKET_PATH_MAX:
        folder = Path(tempfile.gettempdir()) / f"ts-{hashlib.sha1(str(run_dir).encode()).hexdigest()[:12]}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def server_env(settings: ServerSettings, policy: ServingPolicy) -> dict:
    run_dir = settings.run_dir.absolute()
    return {
        **os.environ,
        THREADS_ENV: str(policy.threads_per_worker),  # workers inherit it; the handler reads it
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


def start(settings: ServerSettings) -> subprocess.Popen:
    """Start TorchServe with every model of the settings; whether tokens are checked is resolved here, once
    (--token-auth, or TorchServe's own switch in the config file or the environment)."""
    for name in settings.served_models():
        archive = Path(settings.model_store) / f"{name}.mar"
        if not archive.is_file():
            raise ServingError(f"{archive} not found: run `python -m export resnet` first (it writes the archive)")
    run_dir = settings.run_dir.absolute()
    if alive(_read_pgid(run_dir)):
        raise ServingError(f"a server started from {run_dir} is still running: `python -m serving stop` first")
    settings.token_auth = token_auth_switched_on(settings, os.environ)
    settings.log_dir.mkdir(parents=True, exist_ok=True)
    for old in [*settings.log_dir.glob("*.log"), settings.key_file]:
        old.unlink(missing_ok=True)  # a previous run's key file would not open this run's server
    policy = settings.effective_policy()
    config = write_run_config(settings, policy)
    console = open(settings.log_dir / "console.log", "ab")
    # Own session: Ctrl-C in the terminal reaches us, and stop() signals the whole group (launcher, Java
    # frontend, Python workers) at once.
    process = subprocess.Popen(torchserve_command(settings, config), cwd=run_dir, env=server_env(settings, policy),
                               stdout=console, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True)
    (run_dir / PID_FILE).write_text(str(process.pid))
    return process


class KeysNotWritten(ServingError):
    """Token authorisation is on and TorchServe has not (yet) written a readable key file."""


def auth_headers(settings: ServerSettings, api: str = "inference") -> dict:
    """{"Authorization": "Bearer <key>"} for the inference or management API when token auth is on; {} when off."""
    if not settings.token_auth:
        return {}
    try:
        keys = json.loads(settings.key_file.read_text())
    except FileNotFoundError as error:
        raise KeysNotWritten(f"token authorisation is on but TorchServe has not written {settings.key_file}") from error
    except json.JSONDecodeError as error:  # TorchServe writes it in place: caught mid-write, or damaged
        raise KeysNotWritten(f"{settings.key_file} is not JSON ({error})") from error
    if api not in keys or "key" not in keys[api]:
        raise ServingError(f"{settings.key_file} has no {api} key (it holds {', '.join(keys)})")
    return {"Authorization": f"Bearer {keys[api]['key']}"}


def wait_until_serving(settings: ServerSettings, process: subprocess.Popen | None, image: Path = EXAMPLE_IMAGE,
                       timeout: float = READY_TIMEOUT_S) -> dict[str, dict]:
    """Block until every served model has answered a real prediction: {model: its answer}. A server that exits,
    a model that cannot load or the timeout raise ServingError with what the logs say."""
    body, deadline = Path(image).read_bytes(), time.monotonic() + timeout
    return {name: poll_for_prediction(settings.predictions_url(name), body, lambda: auth_headers(settings),
                                      deadline, process, settings.log_dir)
            for name in settings.served_models()}


def poll_for_prediction(url: str, body: bytes, headers, deadline: float, process: subprocess.Popen | None,
                        log_dir: Path) -> dict:
    """The readiness loop for TorchServe: POST the image to url until it answers 200 (its JSON returned).
    headers() is asked each time (keys appear once TorchServe has written them); process is what must stay
    alive, log_dir where TorchServe's logs say why a model will not load."""
    import requests

    def check() -> None:
        if process is not None and process.poll() is not None:
            raise ServingError(f"TorchServe exited with code {process.returncode}: {exit_reason(log_dir)}")
        failure = load_failure(log_dir)
        if failure:
            raise ServingError(f"the model failed to load: {failure}")

    def post():
        return requests.post(url, data=body, timeout=PROBE_TIMEOUT_S,
                             headers={"Content-Type": "image/jpeg", **headers()})
    try:
        return poll_for_answer(post, check, deadline, retry_on=(KeysNotWritten,)).json()
    except NoAnswer as timeout:
        raise ServingError(f"no successful prediction from {url} in time (last: {timeout.last}); "
                           f"{exit_reason(log_dir)}") from None


@contextlib.contextmanager
def running(settings: ServerSettings, image: Path = EXAMPLE_IMAGE, timeout: float = READY_TIMEOUT_S):
    """A TorchServe whose every model has answered a real prediction, stopped (whole process group) on exit."""
    with running_until_exit(lambda: start(settings),
                            lambda process: wait_until_serving(settings, process, image, timeout),
                            lambda process: stop(settings, process)) as process:
        yield process


def stop(settings: ServerSettings, process: subprocess.Popen | None = None, timeout: float = STOP_TIMEOUT_S) -> bool:
    """SIGTERM the server's process group (Java shuts its workers down), SIGKILL if it lingers."""
    return stop_group(settings.run_dir.absolute() / PID_FILE, process, timeout, "TorchServe")


def _read_pgid(run_dir: Path) -> int | None:
    """The process group our pid file names; None when there is no pid file (no server started from run_dir)."""
    try:
        return read_pgid(run_dir / PID_FILE)
    except VisionExportError as error:
        raise ServingError(str(error)) from None


def curl_line(settings: ServerSettings, model: str | None = None, image: Path = EXAMPLE_IMAGE) -> str:
    try:
        shown = Path(image).resolve().relative_to(Path.cwd())
    except ValueError:  # the image is outside the working folder: show its full path
        shown = image
    token = (f' -H "Authorization: Bearer <inference key from {settings.key_file}>"' if settings.token_auth else "")
    return (f'curl -X POST {settings.predictions_url(model)} -H "Content-Type: image/jpeg"{token} '
            f"--data-binary @{shown}")
