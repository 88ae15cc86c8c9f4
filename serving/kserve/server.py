"""The KServe engine (engine.py) as functions of a KServeSettings, for scripts and tests that start a KServe
server of their own: `with server.running(settings, image): ...`."""

from __future__ import annotations

import subprocess
from pathlib import Path

from serving.kserve.config import KServeSettings
from serving.kserve.engine import KServe, v1_body  # noqa: F401
from serving.settings import EXAMPLE_IMAGE, READY_TIMEOUT_S


def wait_until_serving(settings: KServeSettings, process: subprocess.Popen | None, image: Path = EXAMPLE_IMAGE,
                       timeout: float = READY_TIMEOUT_S) -> dict[str, dict]:
    return KServe(settings).wait_until_ready(process, image, timeout)


def running(settings: KServeSettings, image: Path = EXAMPLE_IMAGE, timeout: float = READY_TIMEOUT_S):
    return KServe(settings).running(image, timeout)
