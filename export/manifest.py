"""manifest.json: one record of what an export wrote and proved. Written last, atomically."""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from export.atomic import atomic_write_text
from export.errors import ExportError, IntegrityError
from runtime.integrity import file_sha256, mismatch

MANIFEST_NAME = "manifest.json"
SCHEMA_VERSION = 1


def library_versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import torch
    import torchvision
    return {"python": platform.python_version(), "torch": torch.__version__,
            "torchvision": torchvision.__version__, "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__}


@dataclass
class Manifest:
    model: dict
    weights: dict
    input: dict
    output: dict
    opset: int
    artifacts: dict = field(default_factory=dict)  # kind -> {path, format, exporter, sha256, bytes, ...}
    refused: dict = field(default_factory=dict)  # kind -> why the exporter refused
    files: dict = field(default_factory=dict)  # other files (labels, reports) -> {sha256, bytes}
    timings_s: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)
    exporter_output: dict = field(default_factory=dict)  # step -> what exporters printed (first lines)
    parity: dict = field(default_factory=dict)
    trace_vs_script: dict = field(default_factory=dict)
    serving: dict = field(default_factory=dict)
    precision: dict = field(default_factory=dict)  # reduced-precision variants: calibration, gate, int8 choice
    versions: dict = field(default_factory=library_versions)
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    schema: int = SCHEMA_VERSION

    def record_file(self, folder: Path, name: str) -> dict:
        path = folder / name
        return {"path": name, "sha256": file_sha256(path), "bytes": path.stat().st_size}

    def write(self, folder: Path) -> Path:
        path = folder / MANIFEST_NAME
        atomic_write_text(path, json.dumps(asdict(self), indent=2, default=str) + "\n")
        return path


def load_manifest(folder: Path) -> Manifest:
    path = Path(folder) / MANIFEST_NAME
    if not path.is_file():
        raise ExportError(f"{path} not found: {folder} is not a complete export; run `python -m export ...` first")
    try:
        data = json.loads(path.read_text())
        return Manifest(**data)
    except (json.JSONDecodeError, TypeError) as error:
        raise ExportError(f"{path} is not a manifest this version understands ({error}); re-run the export") from None


def verify_hashes(folder: Path, manifest: Manifest) -> None:
    """Every artifact and recorded file must exist with the recorded sha256; name each one that does not."""
    problems = {}
    for record in list(manifest.artifacts.values()) + list(manifest.files.values()):
        problem = mismatch(Path(folder) / record["path"], record["sha256"])
        if problem:
            problems[record["path"]] = problem
    if problems:
        raise IntegrityError(problems)
