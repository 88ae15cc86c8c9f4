"""How a KServe ModelServer of ours is configured: its address, its folders, the models it serves and the serving
policy of this machine, written to one JSON file the server process reads (KServe's own module parses the
command line at import, so the settings do not travel as flags)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from handlers.policy import ServingPolicy, machine_policy, this_machine
from serving.torchserve.config import DEFAULT_MODEL_STORE, DEFAULT_RUN_DIR, HOST

HTTP_PORT = 8080  # KServe's default (kserve.constants DEFAULT_HTTP_PORT): what an InferenceService's container serves
PID_FILE = "kserve.pgid"  # beside TorchServe's in the run dir: either engine's server is stopped from its own
SETTINGS_FILE = "kserve-settings.json"
LOG_FILE = "kserve.log"
REFUSAL = "REFUSING TO SERVE:"  # the line the server process logs with the reason a model cannot be served
MODELS_DIR = "models"  # each archive unpacked here, as TorchServe unpacks it for its worker


@dataclass
class KServeSettings:
    model_store: Path = DEFAULT_MODEL_STORE
    models: tuple[str, ...] = ()  # NAME for NAME.mar of the store; python -m serving: every archive there
    host: str = HOST
    http_port: int = HTTP_PORT
    run_dir: Path = DEFAULT_RUN_DIR
    policy: ServingPolicy | None = None  # None: decided for this machine when the server starts
    extra_env: dict = field(default_factory=dict)

    def effective_policy(self) -> ServingPolicy:
        return self.policy or machine_policy(*this_machine())

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
    def log_dir(self) -> Path:
        return self.run_dir.absolute() / "logs"

    @property
    def log_file(self) -> Path:
        return self.log_dir / LOG_FILE

    @property
    def pid_file(self) -> Path:
        return self.run_dir.absolute() / PID_FILE

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
