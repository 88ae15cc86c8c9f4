"""The KServe server process: `python -m serving.kserve.worker RUN_DIR/kserve-settings.json` (started by
server.py). Each archive of the store is unpacked as TorchServe unpacks it (manifest, artifact, labels,
model-config.yaml, handlers/; once per content: handlers/opening.py), opened through the same core after its sha256
check under the policy the run config holds for it, and served with KServe's protocol (app.py): one HTTP process (this one), and the policy's worker
processes behind each model (serving/kserve/pool.py: each opens its own copy; one worker: the core runs here).
A model that cannot be served stops the start with the core's reason (logged, exit 1); a taken port, exit 3; a
worker that died and could not be started again stops the server, exit 1.
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from contract.errors import VisionExportError
from handlers.logs import configure_logging
from serving.kserve.config import REFUSAL, KServeSettings
from serving.kserve.pool import WorkerPool
from serving.ports import bind_error

if TYPE_CHECKING:
    from serving.kserve.versions import VersionedModel

# The pool's workers are spawned processes that import this module first: kserve (seconds of imports) is imported
# where it is used, so that they do not import it too.

logger = logging.getLogger("serving.kserve")
PORT_TAKEN = 3  # uvicorn's STARTUP_FAILURE, as its own bind exits
SERVER_IMPORTS = ("handlers.kserve_model", "serving.kserve.app")  # kserve and torch: imported while workers start


def unpacked_archive(name: str, settings: KServeSettings, archive: Path | None = None,
                     folder: Path | None = None) -> Path:
    """The model's archive (or another version's, into a folder of its own), its signature checked where a key is
    set, unpacked once per content (handlers/opening.py)."""
    from handlers import opening
    from runtime.integrity import verify_archive_signature  # here: the pool's spawned workers import this module
    archive = archive or settings.archive(name)
    verify_archive_signature(archive)  # who made it, where a key is set
    return opening.unpacked(archive, folder or settings.unpacked(name))


def model_of(name: str, settings: KServeSettings, folder: Path, lender: WorkerPool | None = None) -> VersionedModel:
    """The unpacked model under its policy as the run config holds it (its archive's pins applied where it was
    resolved; another version under the same policy), served as one of the server's versions
    (serving/kserve/versions.py). Its worker processes are spawned first: this process's own imports (kserve,
    torch) run while they start. lender: the live version's pool, for another version loaded beside it (its
    spare becomes this one's first worker)."""
    from handlers import opening
    policy = settings.policies[name]
    device, handler = opening.device_of(policy.device), opening.model_config(folder).get("handler")
    pool = WorkerPool.open(name, folder, device, handler, policy, lender) if policy.workers > 1 else None
    from serving.kserve.versions import VersionedModel
    model = VersionedModel(name, folder, policy, device, handler, (lambda *_: pool) if pool else None)
    model.load()
    return model


def other_version(settings: KServeSettings, archive: Path, folder: Path, name: str,
                  lender: WorkerPool | None) -> VersionedModel:
    """Another version of name (a rollout's candidate, Versions.load), unpacked into its folder and served beside
    the live one, whose pool lends it its spare."""
    return model_of(name, settings, unpacked_archive(name, settings, archive, folder), lender)


def serve(settings: KServeSettings) -> int:
    taken = bind_error(settings.host, settings.http_port)  # taken since the engine checked it
    if taken is not None:
        logger.error("cannot serve on %s:%d: %s", settings.host, settings.http_port, taken)
        return PORT_TAKEN
    # Unpacked before the imports start: beside a thread importing, each of the unpacking's many small writes
    # waits for the GIL, and a large archive took several times as long
    folders = {name: unpacked_archive(name, settings) for name in settings.models}
    threading.Thread(target=lambda: [importlib.import_module(name) for name in SERVER_IMPORTS], daemon=True).start()
    models = [model_of(name, settings, folders[name]) for name in settings.models]
    from serving.kserve.app import OurModelServer
    from serving.kserve.versions import Versions
    versions = Versions(settings, functools.partial(other_version, settings))
    for model in models:
        versions.adopt(model)
    for name, policy in settings.policies.items():
        logger.info("serving %s on %s with KServe's protocol: %s", name, settings.url, "; ".join(policy.lines()))
    OurModelServer(settings.host, versions, settings.http_port).start(models)
    broken = [model.core.broken for model in models if isinstance(model.core, WorkerPool) and model.core.broken]
    if broken:
        logger.error("stopped: %s", "; ".join(broken))
        return 1
    return 0


def main(argv: list[str]) -> int:
    configure_logging()
    try:
        return serve(KServeSettings.read(Path(argv[0])))
    except VisionExportError as error:
        logger.error("%s %s", REFUSAL, error)
        return error.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
