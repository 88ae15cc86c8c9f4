"""Package an export folder as a TorchServe archive (.mar) with torch-model-archiver.

The archive holds the handler's code (contract/, runtime/ and handlers/, each package whole),
the served artifact, manifest.json (whose serving decision names it, with the sha256 the handler checks
before opening it), the labels, the held-out photos the export carries (export/package/holdout.py) and
model-config.yaml. It is named after the model (resnet50.mar, served at
/predictions/resnet50) unless the user names it. It is built in a temporary folder inside the model store and renamed into place only
when the export it belongs to has been swapped in, so a model store never holds half an archive or an
archive of a failed export. Each is the name's next version, NAME.vN.mar; only the first export of a name also
makes NAME.mar, the live version (contract/versions.py): later ones wait for `python -m serving rollout`.

Serving policy (workers, batching, threads) is not decided here: the machine that serves decides it
(handlers/policy.py). Only what the user pins with --workers/--batch-size/--max-batch-delay is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from contract.handler_config import TORCHSERVE_KEYS, HandlerConfig
from contract.records import FORM_TIMING_NAME, MANIFEST_NAME, Manifest
from contract.versions import (
    KEEP_VERSIONS,
    UNVERSIONED_ARCHIVE,
    ModelVersion,
    archive_name,
    make_live,
    newest_number,
    plain_archive,
    prune_versions,
)
from export.atomic import ensure_writable_dir
from export.errors import ExportError
from export.package.selection import redecide
from runtime.integrity import SIGN_KEY_ENV, sign_archive

PROJECT_ROOT = Path(__file__).resolve().parents[2]
HANDLER_ENTRY = PROJECT_ROOT / "handlers" / "torchserve_entry.py"
# What the handler imports, each package whole: what serving runs is exactly what development imports.
ARCHIVE_SOURCES = ("contract", "handlers", "runtime")

# deviceType gpu: TorchServe gives each worker a gpu_id when the host has GPUs, and runs on CPU otherwise.
COMMON_CONFIG = {"responseTimeout": 120, "deviceType": "gpu"}
SCRATCH_PREFIX = ".mar-build-"  # + the archiving process's pid: a killed run's folder is recognisable


@dataclass
class ArchiveRequest:
    model_store: Path
    name: str | None = None  # None: the model's name (manifest.model.name)
    overrides: dict = field(default_factory=dict)  # pinned TorchServe keys and handler settings
    # Only the benchmark and the GPU check set this: another kind of the same export, re-decided by the same
    # rule (export.package.selection.redecide); the export itself decides with --serve.
    artifact: str | None = None
    # Only the benchmark sets this: a variant that failed its accuracy gate may be packaged to measure its
    # speed (on random weights the gate measures near-ties, not the pipeline); never for deployment.
    speed_only_ungated: bool = False
    keep_versions: int = KEEP_VERSIONS  # the newest versions of the name the store keeps beside this one
    # Only a rollout sets this: the archive is its candidate, written as the next version and nothing else (no
    # plain archive even for a name without one, no version pruned) until it takes the traffic.
    candidate: bool = False
    # The Ed25519 private key (PEM) that signs the archive (runtime/integrity.py); None: SIGN_KEY_ENV's, if set.
    sign_key: Path | None = None

    def signing_key(self) -> Path | None:
        given = self.sign_key or os.environ.get(SIGN_KEY_ENV)
        return Path(given) if given else None


def model_config_yaml(overrides: dict | None = None) -> str:
    import yaml
    overrides = dict(overrides or {})
    handler_keys = HandlerConfig.keys()
    handler = HandlerConfig.from_dict({k: overrides.pop(k) for k in list(overrides) if k in handler_keys})
    unknown = sorted(set(overrides) - set(TORCHSERVE_KEYS))
    if unknown:
        raise ExportError(f"unknown model-config keys {', '.join(unknown)}; known: "
                          f"{', '.join(TORCHSERVE_KEYS + handler_keys)}")
    config = {**COMMON_CONFIG, **overrides, "handler": handler.to_dict()}
    return ("# TorchServe model configuration (written by `python -m export`).\n"
            "# The served artifact is manifest.json's serving decision (its sha256 is there too).\n"
            "# Workers and batching are decided where the model is served (python -m serving), unless pinned here.\n"
            + yaml.safe_dump(config, sort_keys=False))


def archived_manifest(manifest: Manifest, request: ArchiveRequest) -> Manifest:
    """The manifest the archive ships: the export's, or the same with request.artifact re-decided."""
    if manifest.input.handler_input() is None:  # neither a classifier's image contract nor a whole-image rule
        manifest.input.image_contract()  # says what the handler needs
    if request.artifact is None:
        manifest.served_record()  # the export's decision must name a recorded artifact
        return manifest
    decision = redecide(manifest.decision(), request.artifact, request.speed_only_ungated)
    return replace(manifest, serving=decision)


def content_hash(manifest: Manifest) -> str:
    """sha256 over what the archive serves (each shipped artifact's path and sha256): two archives of the same
    content share it, whatever their version number."""
    served = {kind: record.sha256 for kind, record in manifest.artifacts.items()
              if kind in manifest.decision().candidate_kinds() or record is manifest.served_record()}
    return hashlib.sha256(json.dumps(served, sort_keys=True).encode()).hexdigest()


def next_version(model_store: Path, name: str, manifest: Manifest) -> ModelVersion:
    return ModelVersion(newest_number(model_store, name) + 1, content_hash(manifest))


class PendingArchive:
    """A built .mar waiting in the model store's scratch folder; commit() renames it into place as its version
    (NAME.vN.mar), makes NAME.mar the same file when the name had none (its first export), and removes the
    versions beyond `keep` (never the live one nor the one before it). A rollout's candidate only lands."""

    def __init__(self, scratch: tempfile.TemporaryDirectory, built: Path, target: Path, number: int = 0,
                 keep: int = KEEP_VERSIONS, candidate: bool = False):
        self.scratch, self.built, self.target, self.number, self.keep = scratch, built, target, number, keep
        self.candidate = candidate

    def commit(self) -> Path:
        """The archive written: NAME.mar when it became the live version, else NAME.vN.mar."""
        if not self.number:  # a caller that asked for no version (tests of the archive alone)
            os.replace(self.built, self.target)
            return self.target
        store, name = self.target.parent, self.target.name[:-len(".mar")]
        versioned = store / archive_name(name, self.number)
        os.replace(self.built, versioned)
        if self.candidate:
            return versioned
        written = versioned
        if not plain_archive(store, name).exists():  # the name's first export: what a start serves
            written = make_live(store, name, self.number)
        prune_versions(store, name, self.keep)
        return written

    def discard(self) -> None:
        self.scratch.cleanup()


def prepare_archive(export_dir: Path, manifest: Manifest, request: ArchiveRequest) -> PendingArchive:
    name = request.name or manifest.model.name
    ensure_writable_dir(request.model_store, "--model-store")
    if request.keep_versions < 1:
        raise ExportError(f"--keep-versions {request.keep_versions}: keep at least 1 (the one being written)")
    archived = archived_manifest(manifest, request)
    archived = replace(archived, model_version=next_version(Path(request.model_store), name, archived))
    remove_stale_scratch(Path(request.model_store))
    scratch = tempfile.TemporaryDirectory(dir=request.model_store, prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")
    try:
        built = _run_archiver(Path(export_dir), archived, name, request.overrides, Path(scratch.name))
        if request.signing_key():
            sign_archive(built, request.signing_key())  # over every file, the handler's code included
    except BaseException:
        scratch.cleanup()
        raise
    return PendingArchive(scratch, built, Path(request.model_store) / f"{name}.mar",
                          archived.model_version.number, request.keep_versions, request.candidate)


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


def build_archive(export_dir: Path, manifest: Manifest, model_store: Path, name: str | None = None,
                  artifact: str | None = None, config_overrides: dict | None = None,
                  speed_only_ungated: bool = False, candidate: bool = False) -> Path:
    """Build NAME's next version (default: the model's name) from a complete export folder into the model store:
    the archive written (PendingArchive.commit)."""
    pending = prepare_archive(export_dir, manifest, ArchiveRequest(Path(model_store), name,
                                                                   dict(config_overrides or {}), artifact,
                                                                   speed_only_ungated, candidate=candidate))
    try:
        return pending.commit()
    finally:
        pending.discard()


def run_model_archiver(command: list[str], export_path: Path) -> subprocess.CompletedProcess:
    """torch-model-archiver stages the files in $TMPDIR/<model name> and deletes that folder afterwards, so two
    archivers of the same model name at once break each other; each gets a private TMPDIR in its export path."""
    with tempfile.TemporaryDirectory(dir=export_path, prefix=".archiver-tmp-") as private_tmp:
        return subprocess.run(command, capture_output=True, text=True, env={**os.environ, "TMPDIR": private_tmp})


def _run_archiver(export_dir: Path, manifest: Manifest, name: str, overrides: dict, scratch: Path) -> Path:
    extra = scratch / "extra"
    for package in ARCHIVE_SOURCES:
        (extra / package).mkdir(parents=True)
        for source in sorted((PROJECT_ROOT / package).glob("*.py")):
            shutil.copy2(source, extra / package / source.name)
    (extra / MANIFEST_NAME).write_text(manifest.to_json())
    if manifest.labels_file():
        shutil.copy2(export_dir / manifest.labels_file(), extra / manifest.labels_file())
    if FORM_TIMING_NAME in manifest.files:  # the export's timing of its candidates, read by its kind of machine
        shutil.copy2(export_dir / FORM_TIMING_NAME, extra / FORM_TIMING_NAME)
    for path in [*shipped_files(manifest), *manifest.holdout_photos]:  # the held-out photos a rollout judges it on
        (extra / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(export_dir / path, extra / path)
    config = scratch / "model-config.yaml"
    config.write_text(model_config_yaml(overrides))
    version = str(manifest.model_version.number) if manifest.model_version else UNVERSIONED_ARCHIVE
    return archive_files(name, export_dir / manifest.served_record().path, HANDLER_ENTRY, scratch,
                   extra_files=extra, config_file=config, version=version)


def shipped_files(manifest: Manifest) -> list[str]:
    """The files of the gated candidates beside the served one (which torch-model-archiver takes as the
    serialized file), and every candidate's companions (an OpenVINO IR's weights): the engine chooses among
    them on the machine it runs on."""
    served = manifest.served_record()
    paths = []
    for kind in manifest.decision().candidate_kinds():
        record = manifest.artifacts.get(kind)
        if record is None:
            raise ExportError(f"the serving decision lists {kind!r}, which the manifest does not record; re-run "
                              "the export")
        paths += ([] if record is served else [record.path]) + list(record.companions)
    return list(dict.fromkeys(paths))


def archive_files(name: str, serialized_file: Path, handler: Path, out: Path, extra_files: Path | None = None,
            config_file: Path | None = None, version: str = UNVERSIONED_ARCHIVE) -> Path:
    """torch-model-archiver: OUT/NAME.mar from the served file, the handler, extra files and model config."""
    # TorchServe's own version of the archive: ours (the number), so that two versions can be registered at once
    command = [sys.executable, "-m", "model_archiver.model_packaging", "--model-name", name, "--version", version,
               "--serialized-file", str(serialized_file), "--handler", str(handler),
               "--export-path", str(out), "--force"]
    if extra_files is not None:
        command += ["--extra-files", str(extra_files)]
    if config_file is not None:
        command += ["--config-file", str(config_file)]
    result = run_model_archiver(command, out)
    built = out / f"{name}.mar"
    if result.returncode != 0 or not built.is_file():
        raise ExportError(f"torch-model-archiver failed: {(result.stderr or result.stdout).strip()[-500:]}")
    return built
