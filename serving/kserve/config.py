"""How a KServe ModelServer of ours is configured: the shared serving settings (serving/settings.py) and its HTTP
port, written to one JSON file, its run config, that the server process reads with each model's policy as
resolved here (KServe's own module parses the command line at import, so the settings do not travel as flags)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from contract.policy import PolicyChoices
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

    def pins_of(self, name: str) -> PolicyChoices:
        """The archive's pins but its workers: every model of a KServe server gets the same worker count, the
        command's or the machine's (an archive's pinned workers hold under TorchServe and Ray)."""
        return replace(super().pins_of(name), workers=None)

    def server_workers(self) -> int:
        """The worker processes behind each model (--workers; serving/kserve/pool.py): every model's policy has
        the same (pins_of), a policy given whole its own."""
        return max(policy.workers for policy in self.model_policies().values())

    def write(self) -> Path:
        """The run config the server process reads, each model's policy resolved here."""
        return self.write_file(SETTINGS_FILE)
