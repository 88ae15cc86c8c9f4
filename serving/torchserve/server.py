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
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from handlers.policy import THREADS_ENV, ServingPolicy, machine_policy, this_machine
from models.errors import VisionExportError

PACKAGE_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = PACKAGE_DIR.parent
DEFAULT_CONFIG = PACKAGE_DIR / "config.properties"
EXAMPLE_IMAGE = PROJECT_ROOT / "examples" / "cat.jpg"
READY_TIMEOUT_S = 240
STOP_TIMEOUT_S = 60
PID_FILE = "torchserve.pgid"
# Lines in TorchServe's logs that mean the model will not load; the handler's message is near them.
LOAD_FAILURE = re.compile(r"(Load model failed|Backend worker process died|Worker disconnected.*WORKER_STOPPED"
                          r"|Failed to load model|ModuleNotFoundError|Traceback)")
FAILURES_BEFORE_GIVING_UP = 2
ARCHIVE_UNREADABLE = re.compile(r"Failed to load model: (\S+)\s*\n([^\n]+)")
REFUSAL = "REFUSING TO SERVE:"  # what handlers/image_classifier.py logs when the artifact's sha256 differs


class ServingError(VisionExportError):
    """TorchServe did not come up; the message carries what its logs said."""


@dataclass
class ServerSettings:
    model_store: Path = Path("model-store")
    model_name: str = "resnet"
    host: str = "127.0.0.1"
    inference_port: int = 8080
    management_port: int = 8081
    metrics_port: int = 8082
    grpc_inference_port: int = 7070
    grpc_management_port: int = 7071
    run_dir: Path = Path(".serving")  # logs, TorchServe's pid file and ours
    config: Path = DEFAULT_CONFIG
    extra_env: dict = field(default_factory=dict)
    policy: ServingPolicy | None = None  # None: decided for this machine when the server starts
    token_auth: bool = False  # TorchServe's token authorisation: keys in run_dir/key_file.json
    model_version: str = "1.0"  # what `python -m export` archives
    response_timeout_s: int = 120

    def effective_policy(self) -> ServingPolicy:
        return self.policy or machine_policy(*this_machine())

    @property
    def inference_url(self) -> str:
        return f"http://{self.host}:{self.inference_port}"

    @property
    def management_url(self) -> str:
        return f"http://{self.host}:{self.management_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}"

    @property
    def log_dir(self) -> Path:
        return self.run_dir.absolute() / "logs"

    def predictions_url(self) -> str:
        return f"{self.inference_url}/predictions/{self.model_name}"


def free_port() -> int:
    """A loopback port nobody holds right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def load_command_options(parser, out: str) -> None:
    """The options every load command against a local TorchServe shares (soak, faults)."""
    parser.add_argument("--model-store", type=Path, default=Path("model-store"))
    parser.add_argument("--image", type=Path, default=EXAMPLE_IMAGE)
    parser.add_argument("--token-auth", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(out))


def load_command_settings(args) -> ServerSettings:
    """A server on free loopback ports whose run folder is inside the command's --out."""
    args.out.mkdir(parents=True, exist_ok=True)
    settings = on_free_ports(args.model_store, args.out / "run")
    settings.token_auth = args.token_auth
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    return settings


def interrupt_on_sigterm(signum, frame):
    raise KeyboardInterrupt  # so `timeout`, CI cancellation or kill stop TorchServe on the way out


def run_load_command(body) -> int:
    """run_command with SIGTERM treated as Ctrl-C, so a stopped command stops its TorchServe too."""
    from export.cli import run_command
    signal.signal(signal.SIGTERM, interrupt_on_sigterm)
    return run_command(body, interrupted="interrupted; TorchServe stopped")


def on_free_ports(model_store: Path, run_dir: Path) -> ServerSettings:
    """Settings whose five ports (HTTP and gRPC) are all free: for tests and benchmarks beside other servers."""
    return ServerSettings(model_store=model_store, run_dir=run_dir, inference_port=free_port(),
                          management_port=free_port(), metrics_port=free_port(),
                          grpc_inference_port=free_port(), grpc_management_port=free_port())


RUN_CONFIG = "config.properties"


def run_config_text(settings: ServerSettings, policy: ServingPolicy) -> str:
    """The base config.properties plus this machine's serving policy for the model (TorchServe's per-model
    `models=` settings; values pinned in the archive's model-config.yaml take precedence over them)."""
    model = {settings.model_name: {settings.model_version: {
        "defaultVersion": True, "marName": f"{settings.model_name}.mar",
        **policy.model_config(), "responseTimeout": settings.response_timeout_s}}}
    store = Path(settings.model_store).absolute()
    allowed = (f"\n# Registration (if ever switched on) only from this model store: no URL downloads.\n"
               f"allowed_urls=file://{store}/[^/]*[.]mar\n")
    token = ("\n# Token authorisation on (--token-auth): keys in key_file.json, in TorchServe's working folder.\n"
             "disable_token_authorization=false\n") if settings.token_auth else ""
    return (Path(settings.config).read_text().rstrip("\n")
            + f"\n\n# Serving policy decided on this machine by `python -m serving`: {policy.reason};"
            + f" {policy.threads_per_worker} thread(s) per worker.\nmodels={json.dumps(model)}\n" + allowed + token)


def write_run_config(settings: ServerSettings, policy: ServingPolicy) -> Path:
    path = settings.run_dir.absolute() / RUN_CONFIG
    path.write_text(run_config_text(settings, policy))
    return path


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


KEY_FILE = "key_file.json"  # TorchServe writes it in its working folder (our run dir) when tokens are on


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
            raise ServingError(f"TorchServe exited with code {process.returncode}: {_log_reason(settings)}")
        failure = load_failure(settings)
        if failure:
            raise ServingError(f"the model failed to load: {failure}")
        try:
            response = requests.post(settings.predictions_url(), data=body, timeout=30,
                                     headers={"Content-Type": "image/jpeg", **auth_headers(settings)})
            if response.status_code == 200:
                return response.json()
            last = f"HTTP {response.status_code}: {response.text[:200]}"
        except requests.RequestException as error:
            last = type(error).__name__
        time.sleep(1.0)
    raise ServingError(f"no successful prediction within {timeout:.0f}s (last: {last}); {_log_reason(settings)}")


@contextlib.contextmanager
def running(settings: ServerSettings, image: Path = EXAMPLE_IMAGE, timeout: float = READY_TIMEOUT_S):
    """A TorchServe that has answered a real prediction, stopped (whole process group) on exit."""
    process = start(settings)
    try:
        wait_until_serving(settings, process, image, timeout)
        yield process
    finally:
        stop(settings, process)


def load_failure(settings: ServerSettings) -> str | None:
    """The handler's error once workers have failed to load more than once (TorchServe retries forever)."""
    log = settings.log_dir / "model_log.log"
    frontend = settings.log_dir / "ts_log.log"
    text = (frontend.read_text(errors="replace") if frontend.exists() else "")
    unreadable = ARCHIVE_UNREADABLE.search(text)
    if unreadable:  # the frontend could not even open the archive (truncated, not a zip): no worker will start
        return f"TorchServe could not open {unreadable.group(1)}: {unreadable.group(2).strip()}; rebuild it with `python -m export`"
    died = len(re.findall(r"Backend worker process died|Load model failed", text))
    if died < FAILURES_BEFORE_GIVING_UP:
        return None
    return _refusal(log) or _last_exception(log) or _last_matching(frontend) or "see " + str(settings.log_dir)


def _refusal(path: Path) -> str | None:
    """The handler's one-line refusal (a tampered or truncated archive), when it logged one."""
    if not path.exists():
        return None
    lines = [line.split(" - ", 1)[-1].strip() for line in path.read_text(errors="replace").splitlines()]
    refusals = [line for line in lines if line.startswith(REFUSAL)]
    return refusals[-1] if refusals else None


def _last_exception(path: Path) -> str | None:
    if not path.exists():
        return None
    lines = [line.split(" - ", 1)[-1].strip() for line in path.read_text(errors="replace").splitlines()]
    errors = [line for line in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", line)]
    return errors[-1] if errors else None


def _last_matching(path: Path) -> str | None:
    if not path.exists():
        return None
    matches = [line.strip() for line in path.read_text(errors="replace").splitlines() if LOAD_FAILURE.search(line)]
    return matches[-1][-300:] if matches else None


def _bind_failure(settings: ServerSettings) -> str | None:
    console = settings.log_dir / "console.log"
    text = console.read_text(errors="replace") if console.exists() else ""
    match = re.search(r"Failed to bind to address (\S+)", text)
    return f"port in use: {match.group(1)} (stop what holds it or choose other ports)" if match else None


def _log_reason(settings: ServerSettings) -> str:
    return (_bind_failure(settings) or _last_exception(settings.log_dir / "model_log.log") or _last_matching(settings.log_dir / "ts_log.log")
            or _tail(settings.log_dir / "console.log") or f"see logs in {settings.log_dir}")


def _tail(path: Path, lines: int = 3) -> str | None:
    if not path.exists():
        return None
    return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:]) or None


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
