"""TorchServe's workers as its management API lists them: who they are, and waiting until every one is READY
(readiness of the server means one prediction succeeded; the other workers may still be loading)."""

from __future__ import annotations

import time

from serving.settings import READY_TIMEOUT_S, REQUEST_TIMEOUT_S, ServingError
from serving.torchserve import server
from serving.torchserve.config import ServerSettings

POLL_S = 0.5


def workers(settings: ServerSettings) -> list[dict]:
    """The workers of the served model: [{"pid": ..., "status": "READY" | ...}, ...]."""
    import requests
    response = requests.get(f"{settings.management_url}/models/{settings.model_name}", timeout=REQUEST_TIMEOUT_S,
                            headers=server.auth_headers(settings, "management"))
    response.raise_for_status()
    return response.json()[0]["workers"]


def ready_pids(settings: ServerSettings) -> list[int]:
    return sorted(w["pid"] for w in workers(settings) if w["status"] == "READY")


def wait_all_ready(settings: ServerSettings, error=ServingError) -> list[int]:
    """The pids once as many workers as the policy starts are READY; `error` past READY_TIMEOUT_S."""
    expected = settings.effective_policy().workers
    deadline = time.monotonic() + READY_TIMEOUT_S
    while len(pids := ready_pids(settings)) < expected:
        if time.monotonic() > deadline:
            raise error(f"{len(pids)} of {expected} workers were READY after {READY_TIMEOUT_S} s "
                        f"(logs: {settings.log_dir})")
        time.sleep(POLL_S)
    return pids
