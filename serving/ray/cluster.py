"""The Ray nodes this engine starts and ends: `ray start --head` for a cluster of our own (or `ray start
--address` for a further node, as a second machine joins), each a `--block` process of ours whose Ray processes
stay in its session, so they are found and ended by session id and nothing else on the machine is touched.

Ray's own ports (GCS, raylet, object manager, workers) listen on every interface: they are the cluster's
internal traffic. With token authorisation on (cluster_auth_env) every Ray process of ours runs in Ray's token
mode, so only a holder of the cluster's token joins the cluster or drives it (the rollout's router, captured
photos); off, they have no authentication (docs/scaling.md). Serve's HTTP proxy binds the configured host.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from serving.auth import write_secret
from serving.ray.config import OBJECT_STORE_BYTES
from serving.settings import HOST, PROJECT_ROOT, ServingError, free_port

PROC = Path("/proc")
RAY_TOKEN_FILE = "ray-auth-token"  # our own head node's cluster token, in the run dir (mode 0600, new each start)
# Ray's own: its mode, and where a process finds the cluster's token (else ~/.ray/auth_token).
AUTH_MODE_ENV, TOKEN_ENV, TOKEN_PATH_ENV = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
DEFAULT_TOKEN = Path.home() / ".ray" / "auth_token"
NODE_UP_TIMEOUT_S = 60  # `ray start` until its GCS answers (several processes start, on a slow shared machine)
NODE_STOP_TIMEOUT_S = 20  # SIGTERM to SIGKILL for a node's processes
# How often we ask whether a node starting is up: ray.init, finding no live node yet, asks again only a second
# later, and the head node's first driver is what starts its prestarted workers (Serve's controller and proxy).
NODE_POLL_S = 0.1
# A node's agents do not stop on SIGTERM (they wait to notice their raylet's end): they hold no state, and are
# killed at once when their node is ended.
AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")


def cluster_auth_env(run_dir: Path, joining: bool) -> dict:
    """The environment that puts every Ray process of a server of ours (its head node, its driver, its replicas)
    in Ray's token mode: with a head node of our own, a new token in RUN_DIR/RAY_TOKEN_FILE (another node joins
    with it: RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=...); joining a cluster, the token its owner gave
    (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token), or a ServingError saying so."""
    if joining:
        if not (os.environ.get(TOKEN_ENV) or os.environ.get(TOKEN_PATH_ENV) or DEFAULT_TOKEN.is_file()):
            raise ServingError(f"--token-auth on a running cluster needs its Ray token: set {TOKEN_PATH_ENV} to "
                               f"the file that holds it (or {TOKEN_ENV}, or put it in {DEFAULT_TOKEN})")
        return {AUTH_MODE_ENV: "token"}
    path = write_secret(Path(run_dir).absolute() / RAY_TOKEN_FILE, secrets.token_hex(32))  # Ray's own tokens' size
    return {AUTH_MODE_ENV: "token", TOKEN_PATH_ENV: str(path)}


def join_own_cluster(run_dir: Path) -> None:
    """This process (a driver: the rollout's switchboard) in the token mode of the server whose run dir it reads,
    when that server made a cluster token."""
    path = Path(run_dir).absolute() / RAY_TOKEN_FILE
    if path.is_file():
        os.environ.update({AUTH_MODE_ENV: "token", TOKEN_PATH_ENV: str(path)})


def node_command(temp_dir: Path, num_cpus: int, head_port: int | None = None, address: str | None = None,
                 resources: str | None = None) -> list[str]:
    """`ray start --block` for a head (head_port) or for a node joining address, with its own free ports and
    no dashboard (its HTTP server has no authentication and we do not need it)."""
    command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--disable-usage-stats",
               "--node-ip-address", HOST, "--num-cpus", str(num_cpus), "--temp-dir", str(temp_dir),
               "--object-store-memory", str(OBJECT_STORE_BYTES),
               "--dashboard-agent-listen-port", str(free_port()), "--metrics-export-port", str(free_port())]
    if head_port is not None:
        command += ["--head", "--port", str(head_port), "--include-dashboard", "false",
                    "--ray-client-server-port", str(free_port())]
    else:
        command += ["--address", str(address)]
    if resources:
        command += ["--resources", resources]
    return command


def start_node(command: list[str], log: Path, new_session: bool = False) -> subprocess.Popen:
    """A `ray start --block` process; in a session of its own when it must be ended apart from its starter's.
    The replicas its raylet starts import our code: the project is on their path."""
    path = os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "RAY_USAGE_STATS_ENABLED": "0"}
    with open(log, "ab") as output:
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=new_session)


def wait_for_gcs(address: str, node: subprocess.Popen | None, log: Path, timeout: float = NODE_UP_TIMEOUT_S) -> None:
    """Return once the GCS at address accepts a connection; ServingError with the log's end if the node exits."""
    import socket
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if node is not None and node.poll() is not None:
            raise ServingError(f"`ray start` exited with code {node.returncode}: {log_tail(log)}")
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                return
        except OSError:
            time.sleep(NODE_POLL_S)
    raise ServingError(f"Ray's GCS at {address} did not answer within {timeout:.0f} s: {log_tail(log)}")


def wait_for_live_node(address: str, node: subprocess.Popen, log: Path, timeout: float = NODE_UP_TIMEOUT_S) -> None:
    """Return once the GCS at address lists a live node (the raylet of node, our `ray start`, has registered), so
    that ray.init finds it at once; ServingError with the log's end if the node exits or is not up in time."""
    from ray._raylet import GcsClient  # ray.init's own client of the GCS (Ray pinned in pyproject.toml)
    from ray.core.generated.gcs_pb2 import GcsNodeInfo
    client = GcsClient(address=address)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if node.poll() is not None:
            raise ServingError(f"`ray start` exited with code {node.returncode}: {log_tail(log)}")
        if client.get_all_node_info(timeout=timeout, state_filter=GcsNodeInfo.GcsNodeState.ALIVE):
            return
        time.sleep(NODE_POLL_S)
    raise ServingError(f"no Ray node of the cluster at {address} was up within {timeout:.0f} s: {log_tail(log)}")


def log_tail(log: Path, lines: int = 5) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    return " | ".join(text.strip().splitlines()[-lines:]) or f"see {log}"


def session_members(sid: int) -> list[int]:
    """The live processes of session sid (Ray's actors are process-group leaders of their own, but stay in
    the session of the `ray start` that started their raylet)."""
    members = []
    for process_dir in PROC.glob("[0-9]*"):
        try:
            fields = (process_dir / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(process_dir.name))
    return members


def end_session(sid: int, spare: int | None = None, timeout: float = NODE_STOP_TIMEOUT_S) -> list[str]:
    """SIGTERM every process of session sid but spare, SIGKILL those left after timeout; those killed (names)."""
    targets = [pid for pid in session_members(sid) if pid != spare]
    agents = [pid for pid in targets if process_name(pid).startswith(AGENTS)]
    signal_all(agents, signal.SIGKILL)
    signal_all([pid for pid in targets if pid not in agents], signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [pid for pid in session_members(sid) if pid != spare]
        if not left:
            return []
        time.sleep(0.2)
    left = [pid for pid in session_members(sid) if pid != spare]
    names = [process_name(pid) for pid in left]
    signal_all(left, signal.SIGKILL)
    return names


def process_name(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:80]
    except OSError:
        return str(pid)


def kill_session(sid: int) -> list[int]:
    """SIGKILL every process of session sid at once: a machine that dies."""
    members = session_members(sid)
    signal_all(members, signal.SIGKILL)
    return members


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:  # it ended meanwhile
            pass
