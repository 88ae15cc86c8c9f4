"""A server started in its own process group, known by a pid file in its run folder: alive or not, and stopped
with its whole group (the launcher and every worker it started). TorchServe's and KServe's starts share it."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path

from models.errors import VisionExportError

log = logging.getLogger(__name__)


def read_pgid(pid_file: Path) -> int | None:
    """The process group the pid file names; None when there is no pid file (nothing started from its folder)."""
    if not pid_file.exists():
        return None
    text = pid_file.read_text().strip()
    if not text.isdigit():
        raise VisionExportError(f"{pid_file} holds {text[:40]!r}, not a process id: if no server runs from "
                                f"{pid_file.parent}, delete the file")
    return int(text)


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user: not ours to signal, but the pid is taken
        return True
    return True


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def signal_group(pgid: int, sig: int, name: str) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # the group ended between the liveness check and this signal: nothing to stop
        log.info("%s's process group %d had already exited before %s", name, pgid, signal.Signals(sig).name)


def stop_group(pid_file: Path, process: subprocess.Popen | None, timeout: float, name: str) -> bool:
    """SIGTERM the group (the server shuts its workers down), SIGKILL if it lingers past timeout; the pid file
    goes. False when nothing was running."""
    pgid = process.pid if process is not None else read_pgid(pid_file)
    if pgid is None or not alive(pgid):
        pid_file.unlink(missing_ok=True)
        return False
    signal_group(pgid, signal.SIGTERM, name)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and group_alive(pgid):
        if process is not None:
            process.poll()
        time.sleep(0.3)
    if group_alive(pgid):
        log.warning("%s (process group %d) still running %.0f s after SIGTERM: SIGKILL", name, pgid, timeout)
        signal_group(pgid, signal.SIGKILL, name)
    if process is not None:
        process.wait(timeout=10)
    pid_file.unlink(missing_ok=True)
    return True
