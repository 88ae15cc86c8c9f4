"""How a KServe ModelServer of ours is configured: the shared serving settings (serving/settings.py) and its HTTP
port, written to one JSON file the server process reads with the policy decided (KServe's own module parses the
command line at import, so the settings do not travel as flags)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from handlers.policy import ServingPolicy
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
        path = self.run_dir.absolute() / SETTINGS_FILE
        record = {**asdict(self), "model_store": str(Path(self.model_store).absolute()),
                  "run_dir": str(self.run_dir.absolute()), "models": list(self.models),
                  "policy": asdict(self.effective_policy())}
        path.write_text(json.dumps(record, indent=2))
        return path

    @classmethod
    def read(cls, path: Path) -> "KServeSettings":
        record = json.loads(Path(path).read_text())
        return cls(**{**record, "model_store": Path(record["model_store"]), "run_dir": Path(record["run_dir"]),
                      "models": tuple(record["models"]), "policy": ServingPolicy(**record["policy"])})
