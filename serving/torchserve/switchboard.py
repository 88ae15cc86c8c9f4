"""A running TorchServe's versions through its management API (on loopback; with the management key when token
authorisation is on): register the candidate beside the live version with the live version's workers and
batching, ask /predictions/NAME/VERSION, set-default, unregister. TorchServe's version of an archive is our
version number (export/package/archive.py), so "v3" is TorchServe's "3".

TorchServe routes each request to one version, the default, with no share or mirror: our handler does both in the
default version's workers, as the control file RUN_DIR/routes/NAME.json written here asks (handlers/routes.py).
--canary: each of those workers forwards P % of its requests to the candidate's /predictions/NAME/VERSION on
loopback (with the inference key when tokens are on) and answers with the candidate's answer and version, or, when
the forward fails, counts it and answers itself; --shadow: they keep the photos of the next N requests as files.
The switch and every unload clear both."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import requests

from contract.versions import UNVERSIONED
from handlers.routes import ROUTES_FOLDER, Canary, ModelRoutes
from handlers.routing import ended
from serving.processes import POLL_INTERVAL_S
from serving.rollout.candidate import Candidate, RolloutRefused
from serving.rollout.switchboard import DRAIN_GRACE_S, LOAD_TIMEOUT_S, Switchboard, answer_of
from serving.settings import REQUEST_TIMEOUT_S, on_loopback
from serving.torchserve.config import KEY_FILE, RUN_CONFIG, TOKEN_SWITCH, read_properties
from serving.torchserve.logs import load_failure

DRAIN_POLL_S = 0.2
UNVERSIONED_TS = "1.0"  # what archives made before versions call themselves in TorchServe


def ts_version(label: str) -> str:
    return UNVERSIONED_TS if label == UNVERSIONED else label.lstrip("v")


def our_label(ts_version: str) -> str:
    return f"v{ts_version}" if ts_version.isdigit() else UNVERSIONED


class TorchServeSwitchboard(Switchboard):
    engine = "torchserve"

    def __init__(self, run_dir: Path):
        super().__init__(run_dir)
        self.properties = read_properties(self.run_config(RUN_CONFIG, "TorchServe", "python -m serving --detach"))
        self.inference_url = on_loopback(self.properties["inference_address"])
        self.management_url = on_loopback(self.properties["management_address"])
        self.tokens = self.properties.get(TOKEN_SWITCH, "true").lower() == "false"

    @property
    def model_store(self) -> Path:
        return Path(self.properties["model_store"])

    def headers(self, api: str) -> dict:
        """The key of api ("management" or "inference") when token authorisation is on (TorchServe's key file)."""
        if not self.tokens:
            return {}
        import json
        keys = json.loads((self.run_dir.absolute() / KEY_FILE).read_text())
        return {"Authorization": f"Bearer {keys[api]['key']}"}

    def management(self, method: str, path: str, **params) -> requests.Response:
        return requests.request(method, f"{self.management_url}{path}", params=params or None,
                                headers=self.headers("management"), timeout=LOAD_TIMEOUT_S)

    def described(self, name: str, label: str | None = None) -> list[dict]:
        path = f"/models/{name}" + (f"/{ts_version(label)}" if label else "/all")
        response = self.management("GET", path)
        if response.status_code == 404:
            return []
        return answer_of(response, f"TorchServe's description of {name}")

    def live(self, name: str) -> str:
        response = self.management("GET", f"/models/{name}")
        described = answer_of(response, f"TorchServe's description of {name}")
        return our_label(described[0]["modelVersion"])

    def loaded(self, name: str) -> list[str]:
        return [our_label(model["modelVersion"]) for model in self.described(name)]

    def load_beside(self, name: str, candidate: Candidate) -> None:
        live = self.described(name, self.live(name))[0]
        logged_before = load_failure(self.run_dir.absolute() / "logs")
        response = self.management(
            "POST", "/models", url=candidate.archive.name, model_name=name, synchronous="false",
            initial_workers=str(max(live.get("minWorkers", 1), 1)), batch_size=str(live.get("batchSize", 1)),
            max_batch_delay=str(live.get("maxBatchDelay", 100)), response_timeout=str(live.get("responseTimeout", 120)))
        # Asynchronous: a synchronous registration holds one of the frontend's event loops until the workers are up,
        # and the keep-alive connections of that loop (inference ones too) wait with it.
        if response.status_code not in (200, 202):
            reason = load_failure(self.run_dir.absolute() / "logs") or response.text[:300]
            self.forget(name, candidate.label)
            raise RolloutRefused(f"{candidate.label} cannot load beside {our_label(live['modelVersion'])}: {reason}")
        self.await_answer(name, candidate.label, logged_before)

    def await_answer(self, name: str, label: str, logged_before: str | None) -> None:
        """A real prediction from the new version (its workers may still be starting); unloaded when none comes
        or the logs say a worker failed since it was registered."""
        from serving.settings import EXAMPLE_IMAGE
        deadline, last = time.monotonic() + LOAD_TIMEOUT_S, ""
        while time.monotonic() < deadline:
            failure = load_failure(self.run_dir.absolute() / "logs")
            try:
                self.ask(name, label, EXAMPLE_IMAGE.read_bytes(), {"Content-Type": "image/jpeg"})
                return
            except (RolloutRefused, requests.RequestException) as error:
                last = str(error)
            if failure and failure != logged_before:
                last = failure
                break
            time.sleep(POLL_INTERVAL_S)
        self.forget(name, label)
        raise RolloutRefused(f"{label} loaded but never answered a prediction: {last}")

    def ask(self, name: str, label: str, image: bytes, headers: dict) -> dict:
        response = requests.post(f"{self.inference_url}/predictions/{name}/{ts_version(label)}", data=image,
                                 headers={"Content-Type": "image/png", **headers, **self.headers("inference")},
                                 timeout=REQUEST_TIMEOUT_S)
        return answer_of(response, f"{name} {label}")

    def set_default(self, name: str, label: str) -> None:
        self.routes(name).clear()  # no canary nor capture outlives the switch
        answer_of(self.management("PUT", f"/models/{name}/{ts_version(label)}/set-default"),
                  f"set-default of {name} {label}")

    def routes(self, name: str) -> ModelRoutes:
        return ModelRoutes(self.run_dir.absolute() / ROUTES_FOLDER, name)

    def canary(self, name: str, label: str, percent: float) -> dict:
        routes = self.routes(name)
        if not percent:
            control = routes.read()
            counts = ended(routes.end_canary())  # a forward still held after the settle counts as failed
            return {"label": label, "percent": control.canary.percent if control and control.canary else 0.0,
                    "served": counts["served"], "failed": counts["failed"]}
        routes.start_canary(self.live(name), self.canary_route(name, label, percent))
        return {"label": label, "percent": percent, "served": 0, "failed": 0}

    def canary_route(self, name: str, label: str, percent: float) -> Canary:
        """Where the live workers send the share: the candidate's own route on loopback, with the inference key when
        tokens are on (the control file is this user's only)."""
        url = f"{self.inference_url}/predictions/{name}/{ts_version(label)}"
        return Canary(uuid.uuid4().hex, label, url, self.headers("inference"), percent)

    def capture(self, name: str, count: int) -> None:
        if count:
            self.routes(name).start_capture(self.live(name), count)
        else:
            self.routes(name).stop_capture()

    def captured(self, name: str) -> list[tuple[str, bytes]]:
        return self.routes(name).captured()

    def drain_and_unload(self, name: str, label: str) -> None:
        """Unregistered once its queue is empty and the requests its workers hold had time to finish: TorchServe
        drops what an unregistered version still queues, unanswered."""
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while time.monotonic() < deadline:
            while self.pending(name, label) and time.monotonic() < deadline:
                time.sleep(DRAIN_POLL_S)
            time.sleep(DRAIN_GRACE_S)  # a worker's batch in hand (not in the queue) finishes meanwhile
            if not self.pending(name, label):
                break
        self.unload(name, label)

    def pending(self, name: str, label: str) -> int:
        described = self.described(name, label)
        return int(described[0].get("jobQueueStatus", {}).get("pendingRequests", 0)) if described else 0

    def unload(self, name: str, label: str) -> None:
        self.routes(name).clear()
        answer_of(self.management("DELETE", f"/models/{name}/{ts_version(label)}"), f"unregistering {name} {label}")

    def forget(self, name: str, label: str) -> None:
        """A candidate that failed: unregistered if TorchServe registered it, so no half-loaded version stays."""
        if label in self.loaded(name) and label != self.live(name):
            self.management("DELETE", f"/models/{name}/{ts_version(label)}")
