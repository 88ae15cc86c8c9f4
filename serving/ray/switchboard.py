"""A running Ray Serve server of ours through its version routes, which its server process carries (it is Serve's
driver already: serving/ray/versions.py holds how a version is loaded beside, switched to and unloaded there; the
management key, or loopback without tokens). The gate asks each version on Serve's proxy: the live one at
/predictions/NAME, the candidate at /rollout/NAME/vN."""

from __future__ import annotations

from pathlib import Path

import requests

from serving.auth import auth_headers
from serving.ray.config import GATE_PREFIX, SETTINGS_FILE, RaySettings
from serving.ray.versions import described_version
from serving.rollout.switchboard import RoutedSwitchboard, answer_of
from serving.settings import REQUEST_TIMEOUT_S, on_loopback


class RaySwitchboard(RoutedSwitchboard):
    engine = "ray"

    def __init__(self, run_dir: Path):
        super().__init__(run_dir)
        self.settings = RaySettings.read(self.run_config(SETTINGS_FILE, "Ray", "python -m serving --engine ray --detach"))

    @property
    def control_url(self) -> str:
        return on_loopback(self.settings.signals_url)  # the server's signals server carries the version routes

    @property
    def model_store(self) -> Path:
        return Path(self.settings.model_store)

    def live(self, name: str) -> str:
        """Asked of the live replicas themselves (each gate's ask does): no call to the server process."""
        return described_version(self.settings, name)

    def url(self, name: str, label: str) -> str:
        if label == self.live(name):
            return self.settings.predictions_url(name)
        return f"{self.settings.url}{GATE_PREFIX}/{name}/{label}"

    def ask(self, name: str, label: str, image: bytes, headers: dict) -> dict:
        response = requests.post(self.url(name, label), data=image, timeout=REQUEST_TIMEOUT_S,
                                 headers={"Content-Type": "image/png", **headers, **auth_headers(self.settings)})
        return answer_of(response, f"{name} {label}")
