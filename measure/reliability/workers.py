"""A served model's workers on each engine: who they are (their pids, once each has opened the model), and waiting
until every one is (readiness of a server means one prediction succeeded; the other workers may still be loading).

  torchserve  the workers its management API lists READY
  kserve      the inference workers of the model's pool (serving/kserve/pool.py), as its description route lists them
  ray         the model's replica processes (Ray titles them ray::ServeReplica:APP:DEPLOYMENT) in the server's
              session, once each has written its start phases (handlers/start_phases.py: it opened the model)
"""

from __future__ import annotations

import time

from handlers.start_phases import read_phases
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


# ---------------------------------------------------------------- every engine
def kserve_pids(engine, model: str) -> list[int]:
    import requests
    response = requests.get(f"{engine.settings.url}/v2/models/{model}/description", timeout=REQUEST_TIMEOUT_S,
                            headers=engine.request_headers())
    response.raise_for_status()
    return sorted(worker["pid"] for worker in response.json().get("workers", []))


def ray_pids(engine, model: str, server_pid: int) -> list[int]:
    from serving.ray.cluster import process_name, session_members
    opened = {phases["pid"] for phases in read_phases(engine.settings.run_dir)}
    return sorted(pid for pid in session_members(server_pid)
                  if f"ServeReplica:{model}:" in process_name(pid) and pid in opened)


def serving_pids(engine, model: str, server_pid: int) -> list[int]:
    """The pids of model's workers that have opened it, on engine's running server (server_pid: its process)."""
    if engine.name == "torchserve":
        engine.settings.model_name = model
        return ready_pids(engine.settings)
    if engine.name == "kserve":
        return kserve_pids(engine, model)
    if engine.name == "ray":
        return ray_pids(engine, model, server_pid)
    raise ServingError(f"no way to list the workers of the {engine.name} engine")


def wait_all_serving(engine, model: str, server_pid: int, error=ServingError) -> list[int]:
    """serving_pids once as many workers as the model's policy starts have opened it; `error` past
    READY_TIMEOUT_S."""
    expected = engine.settings.model_policies()[model].workers
    deadline = time.monotonic() + READY_TIMEOUT_S
    while len(pids := serving_pids(engine, model, server_pid)) < expected:
        if time.monotonic() > deadline:
            raise error(f"{len(pids)} of {expected} workers of {model} had opened it after {READY_TIMEOUT_S} s "
                        f"(logs: {engine.settings.log_dir})")
        time.sleep(POLL_S)
    return pids
