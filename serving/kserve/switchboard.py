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

from serving.auth import auth_headers
from serving.kserve.config import SETTINGS_FILE, KServeSettings
from serving.rollout.switchboard import RoutedSwitchboard, answer_of
from serving.settings import REQUEST_TIMEOUT_S


class KServeSwitchboard(RoutedSwitchboard):
    engine = "kserve"

    def __init__(self, run_dir: Path):
        super().__init__(run_dir)
        self.settings = KServeSettings.read(
            self.run_config(SETTINGS_FILE, "KServe", "python -m serving --engine kserve --detach"))

    @property
    def control_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.http_port}"  # without tokens the version routes answer loopback only

    @property
    def model_store(self) -> Path:
        return Path(self.settings.model_store)

    def ask(self, name: str, label: str, image: bytes, headers: dict) -> dict:
        instance: dict = {"image": {"b64": base64.b64encode(image).decode()}}
        if "X-TopK" in headers:
            instance["topk"] = int(headers["X-TopK"])
        if "X-Masks" in headers:
            instance["masks"] = headers["X-Masks"]
        target = name if label == self.live(name) else f"{name}.{label}"
        response = requests.post(f"{self.control_url}/v1/models/{target}:predict", json={"instances": [instance]},
                                 timeout=REQUEST_TIMEOUT_S, headers=auth_headers(self.settings))
        return answer_of(response, f"{name} {label}")["predictions"][0]
