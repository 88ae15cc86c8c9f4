"""The KServe server process: `python -m serving.kserve.worker RUN_DIR/kserve-settings.json` (started by
server.py). Each archive of the store is unpacked as TorchServe unpacks it (manifest, artifact, labels,
model-config.yaml, handlers/), opened through the same core after its sha256 check under the policy the run
config holds for it, and served by KServe's ModelServer with the policy's worker processes (KServe's --workers:
each spawned worker opens its own copy).
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
from handlers.kserve_model import ImageClassifierModel
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


def model_of(name: str, settings: KServeSettings) -> ImageClassifierModel:
    """The model under its policy as the run config holds it (its archive's pins applied where it was resolved)."""
    policy = settings.policies[name]
    folder = unpack(Path(settings.model_store) / f"{name}.mar", settings.unpacked(name))
    device = "cuda:0" if policy.device == "gpu" else "cpu"
    model = ImageClassifierModel(name, folder, policy, device, model_config(folder).get("handler"))
    model.load()
    return model


def serve(settings: KServeSettings) -> None:
    from kserve import ModelServer
    models = [model_of(name, settings) for name in settings.models]
    for name, policy in settings.policies.items():
        logger.info("serving %s on %s with KServe's ModelServer: %s", name, settings.url, "; ".join(policy.lines()))
    app.install(settings.host)
    server = ModelServer(http_port=settings.http_port, workers=settings.server_workers(), enable_grpc=False)
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
