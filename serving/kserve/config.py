"""How a KServe ModelServer of ours is configured: the shared serving settings (serving/settings.py) and its HTTP
port, written to one JSON file the server process reads with the policy decided (KServe's own module parses the
command line at import, so the settings do not travel as flags)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from serving.settings import ServingSettings

HTTP_PORT = 8080  # KServe's default (kserve.constants DEFAULT_HTTP_PORT): what an InferenceService's container serves
SETTINGS_FILE = "kserve-settings.json"
LOG_FILE = "kserve.log"
REFUSAL = "REFUSING TO SERVE:"  # the line the server process logs with the reason a model cannot be served
MODELS_DIR = "models"  # each archive unpacked here, as TorchServe unpacks it for its worker


@dataclass
class KServeSettings(ServingSettings):
    http_port: int = HTTP_PORT

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    def predict_url(self, model: str) -> str:
        """KServe's v1 endpoint of a model."""
        return f"{self.url}/v1/models/{model}:predict"

    def infer_url(self, model: str) -> str:
        """The Open Inference Protocol (v2) endpoint of a model."""
        return f"{self.url}/v2/models/{model}/infer"

    @property
    def log_file(self) -> Path:
        return self.log_dir / LOG_FILE

    def unpacked(self, model: str) -> Path:
        return self.run_dir.absolute() / MODELS_DIR / model

    def write(self) -> Path:
        """The settings file the server process reads, with the policy decided here."""
        return self.write_file(SETTINGS_FILE)
