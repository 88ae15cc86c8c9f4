"""Opening an archive as a request core: the one way TorchServe's handler, KServe's server and workers, Ray's
replicas and the batch do it, each phase of the start timed (handlers/start_phases.py).

    core = open_archive(Path("model-store/clf.mar"), device_of(policy.device), policy, scratch=folder,
                        served_name="clf")  # a resnet50 served as clf: its answers say so

An archive (.mar) is unpacked into `scratch` once per content: a folder that already holds this archive's members
(the names, sizes and CRC-32s of its zip directory, written beside them as UNPACKED_MARK) is opened as it is. That
is cheap and safe because the core checks the served form's sha256 before any of its code runs (handlers/core.py),
whatever the folder. The archive's `handler:` settings are read from its model-config.yaml, as TorchServe hands
them to its handler. A folder (an unpacked archive, an export folder) is opened in place.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from contract.files import atomic_write_text
from handlers.start_phases import StartPhases

if TYPE_CHECKING:
    from handlers.core import ImageCore

GPU = "gpu"  # a ServingPolicy's device that is not the CPU
UNPACKED_MARK = ".unpacked-from"  # in an unpacked folder: the digest of the archive it holds
UNPACKED_DIR = "unpacked"  # in a run dir: each archive unpacked once, for every process that opens it
MODEL_CONFIG = "model-config.yaml"
FROM_ARCHIVE: Any = object()  # open_archive's settings: the archive's own handler section


def device_of(policy_device: str, index: int = 0) -> str:
    """The torch device a worker runs on, named here once for every engine: GPU `index` when its policy says gpu
    (TorchServe names the index it assigned), else the CPU."""
    return f"cuda:{index}" if policy_device == GPU else "cpu"


def shared_scratch(archive: Path, run_dir: Path) -> Path:
    """Where the processes of one run (a Ray replica, the check before it) unpack `archive`, once for all."""
    return Path(run_dir) / UNPACKED_DIR / Path(archive).stem


def model_config(folder: Path) -> dict:
    """An unpacked archive's model-config.yaml, what TorchServe hands its handler as context.model_yaml_config."""
    path = Path(folder) / MODEL_CONFIG
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def archive_digest(members: zipfile.ZipFile) -> str:
    """The archive's content as its zip directory states it (each member's name, size and CRC-32): read without
    unpacking anything."""
    listed = "\n".join(f"{info.filename} {info.file_size} {info.CRC}" for info in members.infolist())
    return hashlib.sha256(listed.encode()).hexdigest()


def unpacked(archive: Path, folder: Path) -> Path:
    """The archive's members in `folder`: kept when it holds this content already, else unpacked afresh. A lock
    beside the folder lets replicas that share it unpack it once."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock, zipfile.ZipFile(archive) as members:
        fcntl.flock(lock, fcntl.LOCK_EX)
        digest = archive_digest(members)
        mark = folder / UNPACKED_MARK
        if mark.is_file() and mark.read_text() == digest:
            return folder
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        members.extractall(folder)
        atomic_write_text(mark, digest)  # last: a folder half unpacked has none, and is unpacked again
    return folder


def open_archive(source: str | Path, device: str = "cpu", policy=None, settings: dict | None = FROM_ARCHIVE,
                 scratch: str | Path | None = None, served_name: str | None = None, **options) -> ImageCore:
    """The core of an archive (unpacked into `scratch`) or of a folder, under the engine's `policy` (a
    ServingPolicy; None: the in-process one), serving the form this machine chooses; `settings`: the handler
    section when the engine has read it already (TorchServe), else the archive's own. `served_name`: the name the
    engine serves it under, which its answers, log lines and metric labels carry (None: its architecture, as the
    batch has it; handlers/core.py's name_served). `options`: the core's (from_folder: threads, machine, measure,
    kind, form)."""
    from handlers.tasks import open_core  # here: a process that only unpacks (KServe's front) needs no torch
    phases = StartPhases.begin()
    source = Path(source)
    with phases.timed("archive"):
        if source.is_dir():
            folder = source
        elif scratch is None:
            raise ValueError(f"{source} is an archive: name a scratch folder to unpack it into")
        else:
            folder = unpacked(source, Path(scratch))
        if settings is FROM_ARCHIVE:
            settings = model_config(folder).get("handler") if not source.is_dir() else None
    return open_core(folder, device, settings, policy=policy, phases=phases, served_name=served_name, **options)
