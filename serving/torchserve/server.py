"""The TorchServe engine (engine.py) as functions of a ServerSettings, for scripts and tests that start a
TorchServe of their own: `with server.running(settings, image): ...`."""

from __future__ import annotations

import subprocess
from pathlib import Path

# What callers of these functions also reach through `server`.
from serving.settings import (  # noqa: F401
    EXAMPLE_IMAGE,
    PROBE_TIMEOUT_S,
    READY_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    STOP_TIMEOUT_S,
    ServingError,
    free_port,
)
from serving.torchserve.config import ServerSettings, on_free_ports  # noqa: F401
from serving.torchserve.engine import KeysNotWritten, TorchServe, auth_headers, poll_for_prediction  # noqa: F401


def start(settings: ServerSettings) -> subprocess.Popen:
    return TorchServe(settings).start()


def wait_until_serving(settings: ServerSettings, process: subprocess.Popen | None, image: Path = EXAMPLE_IMAGE,
                       timeout: float = READY_TIMEOUT_S) -> dict[str, dict]:
    return TorchServe(settings).wait_until_ready(process, image, timeout)


def running(settings: ServerSettings, image: Path = EXAMPLE_IMAGE, timeout: float = READY_TIMEOUT_S):
    return TorchServe(settings).running(image, timeout)


def stop(settings: ServerSettings, process: subprocess.Popen | None = None, timeout: float = STOP_TIMEOUT_S) -> bool:
    return TorchServe(settings).stop(process, timeout)


def curl_line(settings: ServerSettings, model: str | None = None, image: Path = EXAMPLE_IMAGE) -> str:
    return TorchServe(settings).curl_line(model, image)
