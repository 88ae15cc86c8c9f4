"""Writing manifest.json (contract.records.Manifest) and checking an export folder against it."""

from __future__ import annotations

import platform
from datetime import datetime, timezone
from pathlib import Path

from contract.records import MANIFEST_NAME, FileRecord, Manifest
from export.atomic import atomic_write_text
from export.errors import IntegrityError
from runtime.integrity import file_sha256, mismatch


def library_versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import torch
    import torchvision
    return {"python": platform.python_version(), "torch": torch.__version__,
            "torchvision": torchvision.__version__, "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__}


def file_record(folder: Path, name: str) -> FileRecord:
    path = Path(folder) / name
    return FileRecord(path=name, sha256=file_sha256(path), bytes=path.stat().st_size)


def write_manifest(folder: Path, manifest: Manifest) -> Path:
    """Last step of an export: its presence means the folder is complete."""
    manifest.versions = manifest.versions or library_versions()
    manifest.created = manifest.created or datetime.now(timezone.utc).isoformat(timespec="seconds")
    path = Path(folder) / MANIFEST_NAME
    atomic_write_text(path, manifest.to_json())
    return path


def verify_hashes(folder: Path, manifest: Manifest) -> None:
    """Every artifact and recorded file must exist with the recorded sha256; name each one that does not."""
    problems = {}
    for record in manifest.recorded_files():
        problem = mismatch(Path(folder) / record.path, record.sha256)
        if problem:
            problems[record.path] = problem
    if problems:
        raise IntegrityError(problems)
