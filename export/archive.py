"""Package an export folder as a TorchServe archive (.mar) with torch-model-archiver.

The archive holds the handler (handlers/ and the runtime helpers it imports from export/), the served
artifact, manifest.json, index_to_name.json and model-config.yaml. It is built in a temporary folder and
renamed into the model store, so a model store never holds half an archive.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from export.atomic import ensure_writable_dir
from export.errors import ExportError
from export.manifest import MANIFEST_NAME, Manifest

PROJECT_ROOT = Path(__file__).resolve().parent.parent
HANDLER_ENTRY = PROJECT_ROOT / "handlers" / "torchserve_entry.py"
# The handler's code: all of handlers/, and from export/ only the runtime helpers it imports.
ARCHIVE_SOURCES = {"handlers": None, "export": ("__init__.py", "runtime.py")}

# TorchServe model-config.yaml, by where the export runs (override with --workers/--batch-size/...).
# GPU: one worker per GPU, batches of up to 8 within 50 ms keep the device busy.
# CPU: measured with `python -m serving.bench` (resnet50, ONNX Runtime, 2 cores): batching gains no
# throughput on a CPU (a batch of 8 costs 8 single passes) and its delay adds latency, while a worker per
# core with one thread each overlaps one request's decoding with another's inference. Workers are capped
# so a many-core host does not load dozens of copies; threads per worker = cores / workers.
COMMON_CONFIG = {"responseTimeout": 120, "deviceType": "gpu"}  # TorchServe falls back to CPU without a GPU
GPU_SERVING = {"minWorkers": 1, "maxWorkers": 1, "batchSize": 8, "maxBatchDelay": 50}
MAX_CPU_WORKERS = 4


def cpu_serving(cores: int | None = None) -> dict:
    workers = max(1, min(cores or os.cpu_count() or 1, MAX_CPU_WORKERS))
    return {"minWorkers": workers, "maxWorkers": workers, "batchSize": 1, "maxBatchDelay": 5}


def default_serving(cuda_available: bool | None = None) -> dict:
    import torch
    available = torch.cuda.is_available() if cuda_available is None else cuda_available
    return {**(GPU_SERVING if available else cpu_serving()), **COMMON_CONFIG}


HANDLER_CONFIG = {"topk": 5, "fp16": False}
HANDLER_KEYS = ("topk", "fp16", "threads")  # overrides that belong to the handler's section


def model_config_yaml(artifact: str, overrides: dict | None = None) -> str:
    import yaml
    overrides = dict(overrides or {})
    handler = {**HANDLER_CONFIG, "artifact": artifact,
               **{k: overrides.pop(k) for k in list(overrides) if k in HANDLER_KEYS}}
    config = {**default_serving(), **overrides, "handler": handler}
    return ("# TorchServe model configuration (written by `python -m export`).\n"
            "# handler.artifact: which exported artifact is served; the archive holds only that one.\n"
            + yaml.safe_dump(config, sort_keys=False))


def build_archive(export_dir: Path, manifest: Manifest, model_store: Path, name: str,
                  artifact: str | None = None, config_overrides: dict | None = None) -> Path:
    artifact = artifact or manifest.serving.get("default_artifact")
    if artifact not in manifest.artifacts:
        raise ExportError(f"cannot serve {artifact!r}: choose one of {', '.join(manifest.artifacts)} "
                          "(an artifact that passed parity)")
    if not manifest.parity.get("summary", {}).get(artifact, {}).get("passed"):
        raise ExportError(f"artifact {artifact!r} did not pass parity; refusing to package it")
    ensure_writable_dir(model_store, "--model-store")
    record = manifest.artifacts[artifact]
    with tempfile.TemporaryDirectory(dir=model_store, prefix=".mar-build-") as scratch:
        scratch = Path(scratch)
        extra = scratch / "extra"
        for package, names in ARCHIVE_SOURCES.items():
            (extra / package).mkdir(parents=True)
            for source in sorted((PROJECT_ROOT / package).glob("*.py")):
                if names is None or source.name in names:
                    shutil.copy2(source, extra / package / source.name)
        for file_name in [MANIFEST_NAME] + [f for f in manifest.files if f.endswith("index_to_name.json")]:
            shutil.copy2(export_dir / file_name, extra / file_name)
        config = scratch / "model-config.yaml"
        config.write_text(model_config_yaml(artifact, config_overrides))
        command = [sys.executable, "-m", "model_archiver.model_packaging",
                   "--model-name", name, "--version", "1.0",
                   "--serialized-file", str(export_dir / record["path"]),
                   "--handler", str(HANDLER_ENTRY),
                   "--extra-files", str(extra),
                   "--config-file", str(config),
                   "--export-path", str(scratch), "--force"]
        result = subprocess.run(command, capture_output=True, text=True)
        built = scratch / f"{name}.mar"
        if result.returncode != 0 or not built.is_file():
            raise ExportError(f"torch-model-archiver failed: {(result.stderr or result.stdout).strip()[-500:]}")
        target = model_store / f"{name}.mar"
        os.replace(built, target)
    return target
