"""The KServe server process: `python -m serving.kserve.worker RUN_DIR/kserve-settings.json` (started by
server.py). Each archive of the store is unpacked as TorchServe unpacks it (manifest, artifact, labels,
model-config.yaml, handlers/), opened through the same core after its sha256 check, and served by KServe's
ModelServer with the policy's worker processes (KServe's --workers: each spawned worker opens its own copy).
A model that cannot be served stops the start with the core's reason (logged, exit 1).
"""

from __future__ import annotations

import logging
import shutil
import sys
import zipfile
from pathlib import Path

import yaml

from contract.errors import VisionExportError
from handlers.batching import BatchPolicy
from handlers.kserve_model import ImageClassifierModel
from handlers.policy import ServingPolicy
from serving.kserve import app
from serving.kserve.config import REFUSAL, KServeSettings

logger = logging.getLogger("serving.kserve")


def unpack(archive: Path, folder: Path) -> Path:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    with zipfile.ZipFile(archive) as members:
        members.extractall(folder)
    return folder


def model_config(folder: Path) -> dict:
    """The archive's model-config.yaml, what TorchServe hands the core as context.model_yaml_config."""
    path = folder / "model-config.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def batching(config: dict, policy: ServingPolicy) -> BatchPolicy:
    """The policy's batching, unless the archive pins TorchServe's batchSize / maxBatchDelay (they win there too).
    Workers are the server's (KServe's --workers), the policy's for every model."""
    return BatchPolicy(int(config.get("batchSize", policy.batch_size)),
                       int(config.get("maxBatchDelay", policy.max_batch_delay_ms)))


def model_of(name: str, settings: KServeSettings) -> ImageClassifierModel:
    policy = settings.effective_policy()
    folder = unpack(Path(settings.model_store) / f"{name}.mar", settings.unpacked(name))
    config = model_config(folder)
    device = "cuda:0" if policy.device == "gpu" else "cpu"
    model = ImageClassifierModel(name, folder, policy.threads_per_worker, batching(config, policy), device,
                                 config.get("handler"))
    model.load()
    return model


def serve(settings: KServeSettings) -> None:
    from kserve import ModelServer
    policy = settings.effective_policy()
    models = [model_of(name, settings) for name in settings.models]
    logger.info("serving %s on %s with KServe's ModelServer: %s; %d worker(s) x %d thread(s), batch %d within %d ms",
                ", ".join(settings.models), settings.url, policy.reason, policy.workers, policy.threads_per_worker,
                policy.batch_size, policy.max_batch_delay_ms)
    app.install(settings.host)
    server = ModelServer(http_port=settings.http_port, workers=policy.workers, enable_grpc=False)
    server.dataplane = app.RawBytesDataPlane(model_registry=server.registered_models)
    server.start(models)


def main(argv: list[str]) -> int:
    app.configure_logging()
    try:
        serve(KServeSettings.read(Path(argv[0])))
    except VisionExportError as error:
        logger.error("%s %s", REFUSAL, error)
        return error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
