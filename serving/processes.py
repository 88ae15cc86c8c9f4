"""A server started in its own process group, known by a pid file in its run folder: alive or not, and stopped
with its whole group (the launcher and every worker it started); and the one readiness loop, which POSTs until
a real answer comes. Every engine (serving/engine.py) and the LitServe peer of the benchmark build on it."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TypeVar

from contract.errors import INTERRUPTIONS, Stopped, VisionExportError

if TYPE_CHECKING:
    import requests

log = logging.getLogger(__name__)
T = TypeVar("T")


def read_pgid(pid_file: Path) -> int | None:
    """The process group the pid file names; None when there is no pid file (nothing started from its folder)."""
    if not pid_file.exists():
        return None
    text = pid_file.read_text().strip()
    if not text.isdigit():
        raise VisionExportError(f"{pid_file} holds {text[:40]!r}, not a process id: if no server runs from "
                                f"{pid_file.parent}, delete the file")
    return int(text)


PROC = Path("/proc")
ZOMBIE = "Z"  # the state of a process that exited and waits to be reaped


def alive(pid: int | None) -> bool:
    """Whether the process runs (a zombie does not)."""
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user: not ours to signal, but the pid is taken
        return True
    state = state_and_group(PROC / str(pid))
    return state is None or state[0] != ZOMBIE  # without /proc to ask, the signal's answer stands


def group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs. Zombies do not count: where the machine's init does not reap
    orphans (a container without one), an exited server's processes would otherwise stay in its group forever."""
    if not group_exists(pgid):
        return False
    if not PROC.is_dir():  # nothing to tell zombies apart: the group is there
        return True
    for process_dir in PROC.glob("[0-9]*"):
        state = state_and_group(process_dir)
        if state is not None and state[1] == pgid and state[0] != ZOMBIE:
            return True
    return False


def state_and_group(process_dir: Path) -> tuple[str, int] | None:
    """(state, process group) from /proc/PID/stat; None when it cannot be read (the process ended, no /proc)."""
    try:
        fields = (process_dir / "stat").read_text().rsplit(")", 1)[1].split()  # after the command's name
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[2])


def signal_group(pgid: int, sig: int, name: str) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # the group ended between the liveness check and this signal: nothing to stop
        log.info("%s's process group %d had already exited before %s", name, pgid, signal.Signals(sig).name)


def stop_group(pid_file: Path, process: subprocess.Popen | None, timeout: float, name: str,
               leader_stops_workers: bool = False) -> bool:
    """SIGTERM the group, or with leader_stops_workers its leader alone (a server that stops its own workers, and
    would start a new one in place of a worker signalled beside it); SIGKILL whatever of the group lingers past
    timeout; return once no process of the group is left, and the pid file goes. False when nothing was running."""
    pgid = process.pid if process is not None else read_pgid(pid_file)
    if pgid is None or not group_alive(pgid):
        pid_file.unlink(missing_ok=True)
        return False
    if leader_stops_workers and alive(pgid):
        signal_leader(pgid, signal.SIGTERM, name)
    else:
        signal_group(pgid, signal.SIGTERM, name)
    if not wait_for_group(pgid, process, timeout):
        log.warning("%s (process group %d) still running %.0f s after SIGTERM: SIGKILL", name, pgid, timeout)
        signal_group(pgid, signal.SIGKILL, name)
        wait_for_group(pgid, process, KILLED_EXIT_S)
    if process is not None:
        process.wait(timeout=KILLED_EXIT_S)
    pid_file.unlink(missing_ok=True)
    return True


KILLED_EXIT_S = 10  # how long SIGKILLed processes may take to be gone


REAP_GRACE_S = 5  # how long exited processes may wait to be reaped by an init that reaps lazily, or never


def wait_for_group(pgid: int, process: subprocess.Popen | None, timeout: float) -> bool:
    """True once no process of the group is left: each ended, and reaped (our own child by us); one that stays
    unreaped (a zombie) past REAP_GRACE_S counts as gone, as an init may not reap orphans at all. False at the
    timeout while any still runs."""
    deadline, zombies_since = time.monotonic() + timeout, None
    while group_exists(pgid):
        if process is not None:
            process.poll()
        now = time.monotonic()
        if not group_alive(pgid):  # only zombies are left
            zombies_since = zombies_since or now
            if now - zombies_since >= REAP_GRACE_S:
                return True
        else:
            zombies_since = None
            if now >= deadline:
                return False
        time.sleep(0.3)
    return True


def group_exists(pgid: int) -> bool:
    """Whether any process, zombies included, is in the group."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def signal_leader(pid: int, sig: int, name: str) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:  # the leader ended since the check: its group gets the signal instead
        signal_group(pid, sig, name)


def start_until_ready(start: Callable[[], subprocess.Popen], wait: Callable[[subprocess.Popen], T],
                      stop: Callable[[subprocess.Popen], object], name: str,
                      announcement: Callable[[], str]) -> tuple[subprocess.Popen, T]:
    """Start a server, say so (once it started: a refused start says only why), and wait until it is ready;
    whatever stops the wait (an error, Ctrl-C) stops the server."""
    process = start()
    try:
        print(announcement(), flush=True)
        return process, wait(process)
    except BaseException as error:
        stop(process)
        if isinstance(error, VisionExportError):
            error.add_note(f"{name} stopped")
        raise


@contextlib.contextmanager
def running_until_exit(start: Callable[[], subprocess.Popen], wait: Callable[[subprocess.Popen], object],
                       stop: Callable[[subprocess.Popen], object]):
    """A ready server for the with-block, stopped (whole group) on the way out."""
    process = start()
    try:
        wait(process)
        yield process
    finally:
        stop(process)


def sigterm_interrupts() -> None:
    """SIGTERM from now on is a stop as Ctrl-C is (Stopped): what runs stops its server on the way out, as
    start_until_ready and serve_until_stopped do, rather than dying and leaving it running."""
    signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum, frame) -> None:
    raise Stopped


class LogFollower:
    """The lines a server writes to its log files, copied to a stream as they come (as `tail -F` does): a
    container's log (`docker logs`) then holds what the server says, not only what its launcher said. A file
    that does not exist yet is read once it does; one cut shorter (written anew) is read from its start."""

    def __init__(self, paths: list[Path], out=None):
        self.paths, self.out = paths, out
        self.offsets = {path: 0 for path in paths}

    def pump(self) -> None:
        out = self.out or sys.stdout
        for path in self.paths:
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            if size < self.offsets[path]:
                self.offsets[path] = 0
            if size == self.offsets[path]:
                continue
            with open(path, "rb") as log_file:
                log_file.seek(self.offsets[path])
                data = log_file.read(size - self.offsets[path])
            complete = data.rfind(b"\n") + 1  # a line still being written waits for its end
            self.offsets[path] += complete
            if complete:
                out.write(data[:complete].decode(errors="replace"))
        out.flush()


def serve_until_stopped(process: subprocess.Popen, stop: Callable[[], object], name: str,
                        exit_reason: Callable[[], str], follow: LogFollower | None = None) -> int:
    """The foreground server: Ctrl-C or SIGTERM stops it (0); its own exit is an error with its reason (1).
    With `follow`, the server's log lines are copied to stdout meanwhile."""
    sigterm_interrupts()
    pump = follow.pump if follow else lambda: None
    try:
        print("Ctrl-C to stop", flush=True)
        while process.poll() is None:
            pump()
            time.sleep(0.5)
        pump()
        print(f"{name} exited with code {process.returncode}: {exit_reason()}", file=sys.stderr)
        return 1
    except INTERRUPTIONS:
        stop()
        pump()
        print(f"\n{name} stopped")
        return 0


POLL_INTERVAL_S = 0.2  # between tries for a first answer: a start is seen ready within it (a try costs a request)


class NoAnswer(VisionExportError):
    """The deadline passed without an accepted answer; `last` says what the server answered (or why not)."""

    def __init__(self, last: str):
        super().__init__(last)
        self.last = last


def poll_for_answer(post: Callable[[], requests.Response], check: Callable[[], None], deadline: float,
                    accept: Callable[[object], bool] = lambda response: True, interval: float = POLL_INTERVAL_S,
                    retry_on: tuple = ()):
    """Call post() until it answers 200 and accept(response), before the deadline: that response. check() runs
    before each try and raises when waiting is pointless (the server exited, a model cannot load); a connection
    error (not listening yet) or one of retry_on is tried again. NoAnswer with the last answer at the deadline."""
    import requests
    last = "no answer yet"
    while time.monotonic() < deadline:
        check()
        try:
            response = post()
            if response.status_code == 200 and accept(response):
                return response
            last = f"HTTP {response.status_code}: {response.text[:200]}"
        except retry_on as error:
            last = str(error)
        except requests.RequestException as error:  # not listening yet, or a worker still loading
            last = f"{type(error).__name__}: {error}"[:300]
        time.sleep(interval)
    raise NoAnswer(last)
