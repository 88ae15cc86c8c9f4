"""Package an export folder as a TorchServe archive (.mar) with torch-model-archiver.

The archive holds the handler's code (handlers/, runtime/ and the error root models/errors.py), the served
artifact, manifest.json (with its sha256, which the handler checks before opening it), the labels and
model-config.yaml. It is built in a temporary folder inside the model store and renamed into place only
when the export it belongs to has been swapped in, so a model store never holds half an archive or an
archive of a failed export.

Serving policy (workers, batching, threads) is not decided here: the machine that serves decides it
(handlers/policy.py). Only what the user pins with --workers/--batch-size/--max-batch-delay is written.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from export.atomic import ensure_writable_dir
from export.errors import ExportError
from export.manifest import MANIFEST_NAME, Manifest

PROJECT_ROOT = Path(__file__).resolve().parent.parent
HANDLER_ENTRY = PROJECT_ROOT / "handlers" / "torchserve_entry.py"
# What the handler imports: all of handlers/ and runtime/, and from models/ only the error root.
ARCHIVE_SOURCES = {"handlers": None, "runtime": None, "models": ("errors.py",)}

# deviceType gpu: TorchServe gives each worker a gpu_id when the host has GPUs, and runs on CPU otherwise.
COMMON_CONFIG = {"responseTimeout": 120, "deviceType": "gpu"}
PINNABLE_KEYS = ("minWorkers", "maxWorkers", "batchSize", "maxBatchDelay", "responseTimeout")
HANDLER_CONFIG = {"topk": 5, "fp16": False}
HANDLER_KEYS = ("topk", "fp16", "threads", "simulate_hang_s")  # overrides that belong to the handler's section
SCRATCH_PREFIX = ".mar-build-"  # + the archiving process's pid: a killed run's folder is recognisable


@dataclass
class ArchiveRequest:
    model_store: Path
    name: str = "resnet"
    artifact: str | None = None  # None: the manifest's served artifact (export.selection's rule)
    overrides: dict = field(default_factory=dict)  # pinned TorchServe keys and handler settings
    # Only the benchmark sets this: a variant that failed its accuracy gate may be packaged to measure its
    # speed (on random weights the gate measures near-ties, not the pipeline); never for deployment.
    speed_only_ungated: bool = False


def model_config_yaml(artifact: str, overrides: dict | None = None) -> str:
    import yaml
    overrides = dict(overrides or {})
    handler = {**HANDLER_CONFIG, "artifact": artifact,
               **{k: overrides.pop(k) for k in list(overrides) if k in HANDLER_KEYS}}
    unknown = sorted(set(overrides) - set(PINNABLE_KEYS))
    if unknown:
        raise ExportError(f"unknown model-config keys {', '.join(unknown)}; known: "
                          f"{', '.join(PINNABLE_KEYS + HANDLER_KEYS)}")
    config = {**COMMON_CONFIG, **overrides, "handler": handler}
    return ("# TorchServe model configuration (written by `python -m export`).\n"
            "# handler.artifact: the exported artifact this archive serves (its sha256 is in manifest.json).\n"
            "# Workers and batching are decided where the model is served (python -m serving), unless pinned here.\n"
            + yaml.safe_dump(config, sort_keys=False))


def servable_artifact(manifest: Manifest, requested: str | None, speed_only_ungated: bool = False) -> str:
    """The artifact to package: the manifest's choice, or the user's if the serving rule allows it.
    speed_only_ungated (the benchmark only) lets a variant whose one fault is a failed accuracy gate through."""
    decision = manifest.serving
    artifact = requested or decision.get("default_artifact")
    if manifest.input.get("preprocessing") is None:
        raise ExportError("this model takes no RGB image input (N x 3 x H x W in [0, 1]), so the image "
                          "handler cannot serve it; export without --model-store")
    if artifact is None:
        raise ExportError("no artifact may be served: " + "; ".join(
            f"{k}: {why}" for k, why in decision.get("candidates", {}).items()))
    if artifact not in manifest.artifacts:
        raise ExportError(f"cannot serve {artifact!r}: this export has {', '.join(manifest.artifacts)}")
    why_not = decision.get("candidates", {}).get(artifact, "")
    if speed_only_ungated and requested and str(why_not).startswith("accuracy gate"):
        return artifact
    if artifact not in decision.get("servable", []):
        raise ExportError(f"refusing to package {artifact!r}: {decision['candidates'].get(artifact)}; "
                          f"servable here: {', '.join(decision.get('servable', [])) or 'none'}")
    return artifact


class PendingArchive:
    """A built .mar waiting in the model store's scratch folder; commit() renames it into place."""

    def __init__(self, scratch: tempfile.TemporaryDirectory, built: Path, target: Path):
        self.scratch, self.built, self.target = scratch, built, target

    def commit(self) -> Path:
        os.replace(self.built, self.target)
        return self.target

    def discard(self) -> None:
        self.scratch.cleanup()


def prepare_archive(export_dir: Path, manifest: Manifest, request: ArchiveRequest) -> PendingArchive:
    artifact = servable_artifact(manifest, request.artifact, request.speed_only_ungated)
    ensure_writable_dir(request.model_store, "--model-store")
    remove_stale_scratch(Path(request.model_store))
    scratch = tempfile.TemporaryDirectory(dir=request.model_store, prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")
    try:
        built = _run_archiver(Path(export_dir), manifest, request, artifact, Path(scratch.name))
    except BaseException:
        scratch.cleanup()
        raise
    return PendingArchive(scratch, built, Path(request.model_store) / f"{request.name}.mar")


def remove_stale_scratch(model_store: Path) -> None:
    """Scratch folders of archivers that were killed (SIGKILL leaves them): their process is gone."""
    for folder in model_store.glob(f"{SCRATCH_PREFIX}*"):
        pid = folder.name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def build_archive(export_dir: Path, manifest: Manifest, model_store: Path, name: str,
                  artifact: str | None = None, config_overrides: dict | None = None,
                  speed_only_ungated: bool = False) -> Path:
    """Build NAME.mar from a complete export folder and rename it into the model store."""
    pending = prepare_archive(export_dir, manifest, ArchiveRequest(Path(model_store), name, artifact,
                                                                   dict(config_overrides or {}),
                                                                   speed_only_ungated))
    try:
        return pending.commit()
    finally:
        pending.discard()


def run_model_archiver(command: list[str], export_path: Path) -> subprocess.CompletedProcess:
    """torch-model-archiver stages the files in $TMPDIR/<model name> and deletes that folder afterwards, so two
    archivers of the same model name at once break each other; each gets a private TMPDIR in its export path."""
    with tempfile.TemporaryDirectory(dir=export_path, prefix=".archiver-tmp-") as private_tmp:
        return subprocess.run(command, capture_output=True, text=True, env={**os.environ, "TMPDIR": private_tmp})


def _run_archiver(export_dir: Path, manifest: Manifest, request: ArchiveRequest, artifact: str,
                  scratch: Path) -> Path:
    extra = scratch / "extra"
    for package, names in ARCHIVE_SOURCES.items():
        (extra / package).mkdir(parents=True)
        for source in sorted((PROJECT_ROOT / package).glob("*.py")):
            if names is None or source.name in names:
                shutil.copy2(source, extra / package / source.name)
    for file_name in [MANIFEST_NAME] + [f for f in manifest.files if f.endswith("index_to_name.json")]:
        shutil.copy2(export_dir / file_name, extra / file_name)
    config = scratch / "model-config.yaml"
    config.write_text(model_config_yaml(artifact, request.overrides))
    command = [sys.executable, "-m", "model_archiver.model_packaging",
               "--model-name", request.name, "--version", "1.0",
               "--serialized-file", str(export_dir / manifest.artifacts[artifact]["path"]),
               "--handler", str(HANDLER_ENTRY),
               "--extra-files", str(extra),
               "--config-file", str(config),
               "--export-path", str(scratch), "--force"]
    result = run_model_archiver(command, scratch)
    built = scratch / f"{request.name}.mar"
    if result.returncode != 0 or not built.is_file():
        raise ExportError(f"torch-model-archiver failed: {(result.stderr or result.stdout).strip()[-500:]}")
    return built
