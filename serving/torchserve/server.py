"""Start TorchServe on loopback, wait for a real prediction, and stop it cleanly.

TorchServe's /ping can answer Healthy while every worker crashes, so readiness here means: a POST of a
real image returned 200 with predictions. A worker that fails to load is caught from the logs and
reported with the handler's own error instead of waiting out the timeout.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from handlers.policy import THREADS_ENV, ServingPolicy
# Settings, ports and timeouts live in config.py; the names callers reach through `server` are imported here.
from serving.torchserve.config import (DEFAULT_CONFIG, EXAMPLE_IMAGE, KEY_FILE, READY_TIMEOUT_S, REQUEST_TIMEOUT_S,
                                       STOP_TIMEOUT_S, ServerSettings, ServingError, free_port, on_free_ports,
                                       run_config_text, write_run_config)
from serving.torchserve.logs import exit_reason, load_failure

log = logging.getLogger(__name__)
PID_FILE = "torchserve.pgid"


def torchserve_command(settings: ServerSettings, config: Path) -> list[str]:
    executable = shutil.which("torchserve", path=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    if not executable:
        raise ServingError("torchserve is not installed: pip install -e '.[serving]' (see README)")
    return [executable, "--start", "--foreground", "--ncs",
            "--ts-config", str(Path(config).absolute()),
            "--model-store", str(Path(settings.model_store).absolute()),
            "--models", f"{settings.model_name}={settings.model_name}.mar"]


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
    archive = Path(settings.model_store) / f"{settings.model_name}.mar"
    if not archive.is_file():
        raise ServingError(f"{archive} not found: run `python -m export resnet` first (it writes the archive)")
    run_dir = settings.run_dir.absolute()
    if (run_dir / PID_FILE).exists() and _alive(_read_pgid(run_dir)):
        raise ServingError(f"a server started from {run_dir} is still running: `python -m serving stop` first")
    settings.log_dir.mkdir(parents=True, exist_ok=True)
    for old in settings.log_dir.glob("*.log"):
        old.unlink()
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


def auth_headers(settings: ServerSettings, api: str = "inference") -> dict:
    """{"Authorization": "Bearer <key>"} for the inference or management API when token auth is on."""
    if not settings.token_auth:
        return {}
    path = settings.run_dir.absolute() / KEY_FILE
    try:
        return {"Authorization": f"Bearer {json.loads(path.read_text())[api]['key']}"}
    except (OSError, ValueError, KeyError):  # not written yet: TorchServe is still starting
        return {}


def wait_until_serving(settings: ServerSettings, process: subprocess.Popen | None, image: Path = EXAMPLE_IMAGE,
                       timeout: float = READY_TIMEOUT_S) -> dict:
    """Block until a real prediction succeeds; raise ServingError with the log's reason otherwise."""
    import requests
    body = Path(image).read_bytes()
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise ServingError(f"TorchServe exited with code {process.returncode}: {exit_reason(settings.log_dir)}")
        failure = load_failure(settings.log_dir)
        if failure:
            raise ServingError(f"the model failed to load: {failure}")
        try:
            response = requests.post(settings.predictions_url(), data=body, timeout=REQUEST_TIMEOUT_S,
                                     headers={"Content-Type": "image/jpeg", **auth_headers(settings)})
            if response.status_code == 200:
                return response.json()
            last = f"HTTP {response.status_code}: {response.text[:200]}"
        except requests.RequestException as error:
            last = type(error).__name__
        time.sleep(1.0)
    raise ServingError(f"no successful prediction within {timeout:.0f}s (last: {last}); {exit_reason(settings.log_dir)}")


@contextlib.contextmanager
def running(settings: ServerSettings, image: Path = EXAMPLE_IMAGE, timeout: float = READY_TIMEOUT_S):
    """A TorchServe that has answered a real prediction, stopped (whole process group) on exit."""
    process = start(settings)
    try:
        wait_until_serving(settings, process, image, timeout)
        yield process
    finally:
        stop(settings, process)


def stop(settings: ServerSettings, process: subprocess.Popen | None = None, timeout: float = STOP_TIMEOUT_S) -> bool:
    """SIGTERM the server's process group (Java shuts its workers down), SIGKILL if it lingers."""
    run_dir = settings.run_dir.absolute()
    pgid = process.pid if process is not None else _read_pgid(run_dir)
    if pgid is None or not _alive(pgid):
        (run_dir / PID_FILE).unlink(missing_ok=True)
        return False
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _group_alive(pgid):
        if process is not None:
            process.poll()
        time.sleep(0.3)
    if _group_alive(pgid):
        _signal_group(pgid, signal.SIGKILL)
    if process is not None:
        process.wait(timeout=10)
    (run_dir / PID_FILE).unlink(missing_ok=True)
    return True


def _read_pgid(run_dir: Path) -> int | None:
    try:
        return int((run_dir / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except OSError:
        return False


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass


def curl_line(settings: ServerSettings, image: Path = EXAMPLE_IMAGE) -> str:
    try:
        shown = Path(image).resolve().relative_to(Path.cwd())
    except ValueError:
        shown = image
    token = (f' -H "Authorization: Bearer <inference key from {settings.run_dir / KEY_FILE}>"'
             if settings.token_auth else "")
    return (f'curl -X POST {settings.predictions_url()} -H "Content-Type: image/jpeg"{token} '
            f"--data-binary @{shown}")
