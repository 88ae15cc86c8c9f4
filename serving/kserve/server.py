"""Start KServe's ModelServer with our models on loopback, wait until each model has answered a real prediction
through KServe's v1 endpoint, and stop it with its worker processes."""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

from serving.kserve.config import REFUSAL, KServeSettings
from serving.processes import NoAnswer, alive, poll_for_answer, read_pgid, running_until_exit, stop_group
from serving.torchserve.config import (
    EXAMPLE_IMAGE,
    PROBE_TIMEOUT_S,
    PROJECT_ROOT,
    READY_TIMEOUT_S,
    STOP_TIMEOUT_S,
    ServingError,
)

POLL_S = 1.0
LOG_TAIL_LINES = 5


def start(settings: KServeSettings) -> subprocess.Popen:
    for name in settings.models:
        if not (Path(settings.model_store) / f"{name}.mar").is_file():
            raise ServingError(f"{name}.mar not found in {settings.model_store}: run `python -m export resnet` first")
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    if alive(read_pgid(settings.pid_file)):
        raise ServingError(f"a KServe server started from {settings.run_dir.absolute()} is still running: "
                           "`python -m serving stop --engine kserve` first")
    settings.log_dir.mkdir(parents=True, exist_ok=True)
    settings.log_file.unlink(missing_ok=True)
    config = settings.write()
    # Own session: stop() signals the whole group, the ModelServer and the workers it spawned.
    with open(settings.log_file, "ab") as log:
        process = subprocess.Popen([sys.executable, "-m", "serving.kserve.worker", str(config)],
                                   cwd=settings.run_dir.absolute(), stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True,
                                   env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT), **settings.extra_env})
    settings.pid_file.write_text(str(process.pid))
    return process


def v1_body(image: Path) -> dict:
    """KServe's v1 request for one image: {"instances": [{"image": {"b64": ...}}]}."""
    return {"instances": [{"image": {"b64": base64.b64encode(Path(image).read_bytes()).decode()}}]}


def wait_until_serving(settings: KServeSettings, process: subprocess.Popen | None, image: Path = EXAMPLE_IMAGE,
                       timeout: float = READY_TIMEOUT_S) -> dict[str, dict]:
    """{model: its answer} once every model has answered a real prediction; ServingError with the log's reason
    when the server exits or the timeout passes."""
    deadline = time.monotonic() + timeout
    return {name: poll_for_prediction(settings, name, v1_body(image), process, deadline) for name in settings.models}


def poll_for_prediction(settings: KServeSettings, name: str, body: dict, process, deadline: float) -> dict:
    import requests

    def check() -> None:
        if process is not None and process.poll() is not None:
            raise ServingError(f"the KServe server exited with code {process.returncode}: {exit_reason(settings)}")
    try:
        response = poll_for_answer(lambda: requests.post(settings.predict_url(name), json=body,
                                                         timeout=PROBE_TIMEOUT_S), check, deadline, interval=POLL_S)
    except NoAnswer as timeout:
        raise ServingError(f"no successful prediction from {settings.predict_url(name)} in time (last: "
                           f"{timeout.last}); {exit_reason(settings)}") from None
    return response.json()["predictions"][0]


def exit_reason(settings: KServeSettings) -> str:
    """The worker's refusal when it logged one, else the end of the log."""
    text = settings.log_file.read_text(errors="replace") if settings.log_file.exists() else ""
    refusals = [line.split(REFUSAL, 1)[1].strip() for line in text.splitlines() if REFUSAL in line]
    if refusals:
        return refusals[-1]
    return " | ".join(text.strip().splitlines()[-LOG_TAIL_LINES:]) or f"see {settings.log_file}"


def stop(settings: KServeSettings, process: subprocess.Popen | None = None, timeout: float = STOP_TIMEOUT_S) -> bool:
    return stop_group(settings.pid_file, process, timeout, "KServe")


@contextlib.contextmanager
def running(settings: KServeSettings, image: Path = EXAMPLE_IMAGE, timeout: float = READY_TIMEOUT_S):
    """A KServe server whose every model has answered a real prediction, stopped (whole group) on exit."""
    with running_until_exit(lambda: start(settings),
                            lambda process: wait_until_serving(settings, process, image, timeout),
                            lambda process: stop(settings, process)) as process:
        yield process


def curl_line(settings: KServeSettings, model: str, image: Path = EXAMPLE_IMAGE) -> str:
    return (f'echo "{{\\"instances\\": [{{\\"image\\": {{\\"b64\\": \\"$(base64 -w0 {image})\\"}}}}]}}" | '
            f'curl -sS -X POST {settings.predict_url(model)} -H "Content-Type: application/json" --data-binary @-')
