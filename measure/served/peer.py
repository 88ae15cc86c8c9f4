"""The LitServe peer of the serving benchmark, run as its user would run it: `python -m
measure.served.peer_litserve EXPORT_DIR PORT` on a free loopback port, in its own process group (LitServe
starts its API server and inference workers as child processes), ready once a real prediction answers 200,
stopped with its whole group.

LitServe reads a body as JSON or as a form, so hey sends each image to it as the multipart form a user's
`curl -F content=@photo.jpg` sends: the same bytes, wrapped in one form part (built once per body here).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from measure.command import MeasureError
from measure.loadgen import content_type
from serving.processes import NoAnswer, poll_for_answer
from serving.settings import HOST, PROJECT_ROOT, READY_TIMEOUT_S, REQUEST_TIMEOUT_S, STOP_TIMEOUT_S, free_port

FORM_FIELD = "content"  # the form field peer_litserve.py reads
BOUNDARY = "vision-export-bench-boundary"
FORM_CONTENT_TYPE = f"multipart/form-data; boundary={BOUNDARY}"
POLL_S = 1.0
LOG_TAIL_CHARS = 1500


def installed() -> bool:
    """LitServe and the form parser its server needs for file uploads (python-multipart)."""
    return all(importlib.util.find_spec(module) is not None for module in ("litserve", "python_multipart"))


def litserve_version() -> str:
    return version("litserve")


def form_body(image: Path, folder: Path) -> Path:
    """image wrapped as one multipart form part (what curl -F sends), written once into folder."""
    head = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{FORM_FIELD}\"; filename=\"{image.name}\"\r\n"
            f"Content-Type: {content_type(image)}\r\n\r\n").encode()
    path = folder / f"{image.name}.form"
    path.write_bytes(head + image.read_bytes() + f"\r\n--{BOUNDARY}--\r\n".encode())
    return path


def start(export_dir: Path, port: int, run_dir: Path) -> subprocess.Popen:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "litserve.log", "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "measure.served.peer_litserve", str(Path(export_dir).absolute()),
                                 str(port)], cwd=run_dir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})


def log_tail(run_dir: Path) -> str:
    path = run_dir / "litserve.log"
    return path.read_text(errors="replace")[-LOG_TAIL_CHARS:] if path.exists() else "(no log)"


def wait_until_ready(url: str, form: Path, process: subprocess.Popen, run_dir: Path,
                     timeout: float = READY_TIMEOUT_S) -> dict:
    """POST the form until LitServe answers 200 with predictions; its exit or the timeout is a MeasureError
    with the end of its log."""
    import requests
    body = form.read_bytes()

    def check() -> None:
        if process.poll() is not None:
            raise MeasureError(f"the LitServe peer exited with code {process.returncode}:\n{log_tail(run_dir)}")

    def post():
        return requests.post(url, data=body, headers={"Content-Type": FORM_CONTENT_TYPE}, timeout=REQUEST_TIMEOUT_S)
    try:
        return poll_for_answer(post, check, time.monotonic() + timeout, accept=lambda r: "predictions" in r.json(),
                               interval=POLL_S).json()
    except NoAnswer as late:
        raise MeasureError(f"the LitServe peer gave no prediction at {url} within {timeout:.0f} s (last: "
                           f"{late.last}):\n{log_tail(run_dir)}") from None


def stop(process: subprocess.Popen, timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM the peer's process group; then SIGKILL whatever of the group is left (a worker that lingers)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@dataclass(frozen=True)
class Peer:
    url: str  # its /predict
    process: subprocess.Popen  # the leader of its process group


@contextlib.contextmanager
def running(export_dir: Path, run_dir: Path, ready_body: Path):
    """A LitServe peer of the export that has answered a real prediction, stopped with its group on exit."""
    port = free_port()
    url = f"http://{HOST}:{port}/predict"
    process = start(export_dir, port, run_dir)
    try:
        wait_until_ready(url, form_body(ready_body, run_dir), process, run_dir)
        yield Peer(url, process)
    finally:
        stop(process)
