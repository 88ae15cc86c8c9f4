"""A running KServe ModelServer of ours through its version routes (serving/kserve/versions.py; the management
key, or loopback without tokens): the candidate loaded from the store beside the live version with the same policy, asked directly at
/v1/models/NAME.vN:predict, NAME switched to it, the old one unloaded once the requests it holds are answered.

--canary P: the server's default version hands P % of its requests to the candidate (its answers counted) until the
switch. --shadow N: the server keeps the photos of NAME's next N requests as they arrive. In a cluster, `python -m serving deploy kserve --canary-percent P`
writes KServe's own canaryTrafficPercent."""

from __future__ import annotations

import base64
from pathlib import Path

import requests

from serving.auth import MANAGEMENT, auth_headers
from serving.kserve.config import SETTINGS_FILE, KServeSettings
from serving.rollout.candidate import Candidate, RolloutRefused
from serving.rollout.switchboard import LOAD_TIMEOUT_S, Switchboard, answer_of
from serving.settings import REQUEST_TIMEOUT_S


class KServeSwitchboard(Switchboard):
    engine = "kserve"

    def __init__(self, run_dir: Path):
        super().__init__(run_dir)
        self.settings = KServeSettings.read(
            self.run_config(SETTINGS_FILE, "KServe", "python -m serving --engine kserve --detach"))
        self.base = f"http://127.0.0.1:{self.settings.http_port}"  # without tokens the version routes answer loopback only

    @property
    def model_store(self) -> Path:
        return Path(self.settings.model_store)

    def versions(self, method: str, path: str) -> requests.Response:
        return requests.request(method, f"{self.base}/rollout/{path}", timeout=LOAD_TIMEOUT_S,
                                headers=auth_headers(self.settings, MANAGEMENT))

    def live(self, name: str) -> str:
        return answer_of(self.versions("GET", name), f"{name}'s versions")["default"]

    def loaded(self, name: str) -> list[str]:
        response = self.versions("GET", name)
        return answer_of(response, f"{name}'s versions")["loaded"] if response.status_code == 200 else []

    def load_beside(self, name: str, candidate: Candidate) -> None:
        """Loaded once its first worker is ready (its others still starting: serving/kserve/pool.py), then one
        real prediction; a candidate that cannot answer it is unloaded and refused."""
        from serving.settings import EXAMPLE_IMAGE
        response = self.versions("POST", f"{name}/{candidate.label}")
        if response.status_code != 200:
            raise RolloutRefused(f"{candidate.label} cannot load beside {self.live(name)}: "
                                 f"{response.json().get('detail', response.text[:300])}")
        try:
            self.ask(name, candidate.label, EXAMPLE_IMAGE.read_bytes(), {})
        except (RolloutRefused, requests.RequestException) as error:
            self.unload(name, candidate.label)
            raise RolloutRefused(f"{candidate.label} loaded but did not answer a prediction: {error}") from None

    def ask(self, name: str, label: str, image: bytes, headers: dict) -> dict:
        instance: dict = {"image": {"b64": base64.b64encode(image).decode()}}
        if "X-TopK" in headers:
            instance["topk"] = int(headers["X-TopK"])
        if "X-Masks" in headers:
            instance["masks"] = headers["X-Masks"]
        target = name if label == self.live(name) else f"{name}.{label}"
        response = requests.post(f"{self.base}/v1/models/{target}:predict", json={"instances": [instance]},
                                 timeout=REQUEST_TIMEOUT_S, headers=auth_headers(self.settings))
        return answer_of(response, f"{name} {label}")["predictions"][0]

    def set_default(self, name: str, label: str) -> None:
        answer_of(self.versions("PUT", f"{name}/{label}/default"), f"switching {name} to {label}")

    def canary(self, name: str, label: str, percent: float) -> dict:
        return answer_of(self.versions("PUT", f"{name}/{label}/canary?percent={percent}"), f"a canary of {name} {label}")

    def capture(self, name: str, count: int) -> None:
        answer_of(self.versions("PUT", f"{name}/capture?count={count}"), f"keeping {name}'s requests")

    def captured(self, name: str) -> list[tuple[str, bytes]]:
        kept = answer_of(self.versions("GET", f"{name}/captured"), f"{name}'s kept requests")["captured"]
        return [(photo["id"], base64.b64decode(photo["b64"])) for photo in kept]

    def drain_and_unload(self, name: str, label: str) -> None:
        self.unload(name, label)  # the server waits until the requests the old version holds are answered

    def unload(self, name: str, label: str) -> None:
        answer_of(self.versions("DELETE", f"{name}/{label}"), f"unloading {name} {label}")
