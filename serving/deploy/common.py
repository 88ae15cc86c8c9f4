"""What the KServe and Triton writers share: per-replica numbers, atomic output folders, YAML."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from contract.errors import VisionExportError
from contract.policy import GPU_BATCH_SIZE
from models.resnet import DEFAULT_ARCH

DEFAULT_EXPORT_DIR = Path("artifacts") / DEFAULT_ARCH  # where `python -m export resnet` writes by default
# Per-replica throughput and the concurrency that saturates it, as measured in this project on a 2-core machine
# (resnet50, ONNX Runtime, the CPU policy of 2 workers x 1 thread; docs/benchmarks.md). Used when no
# bench-results/results.json from `python -m measure bench` is at hand.
MEASURED_CPU_REPLICA_RPS = 16.0
MEASURED_CPU_SATURATING_CONCURRENCY = 2
# The kserve engine's, measured the same way (resnet18, `python -m measure bench --configurations
# default,kserve`; the run is named in MEASURED's source). Used for its InferenceService when no results.json has
# kserve rows.
MEASURED_KSERVE_CPU_REPLICA_RPS = 23.1
MEASURED_KSERVE_CPU_SATURATING_CONCURRENCY = 1
MEASURED = {"default": (MEASURED_CPU_REPLICA_RPS, MEASURED_CPU_SATURATING_CONCURRENCY,
                        "measured in this project (docs/benchmarks.md), resnet50 on 2 CPU cores"),
            "kserve": (MEASURED_KSERVE_CPU_REPLICA_RPS, MEASURED_KSERVE_CPU_SATURATING_CONCURRENCY,
                       "measured in this project (docs/results/2026-11-24-serving-bench-kserve-engine), resnet18 on 2 "
                       "CPU cores")}
# Not measured here (no GPU): keep a GPU replica's batches full, two batches in flight.
GPU_TARGET_CONCURRENCY = 2 * GPU_BATCH_SIZE
MAX_REPLICAS = 8
BENCH_RESULTS = Path("bench-results") / "results.json"
SATURATION = 0.9  # a replica is busy from the concurrency that gets 90 % of its best throughput


class DeployError(VisionExportError):
    """Deployment material cannot be written as asked; the message says why and what to do."""


@dataclass(frozen=True)
class ReplicaNumbers:
    requests_per_s: float
    saturating_concurrency: int
    source: str


def replica_numbers(model: str, results: Path = BENCH_RESULTS, configuration: str = "default") -> ReplicaNumbers:
    """Per-replica throughput and the concurrency that saturates it, from the serving benchmark of this model
    if it ran (the configuration's rows: 'default' for TorchServe, 'kserve' for KServe's ModelServer), else the
    figure measured in this project (said on the terminal)."""
    if results.is_file():
        rows = [r for r in json.loads(results.read_text()) if isinstance(r, dict) and r.get("model") == model
                and r.get("configuration") == configuration and r.get("req_per_s")]
        if rows:
            best = max(r["req_per_s"] for r in rows)
            busy = min(r["concurrency"] for r in rows if r["req_per_s"] >= SATURATION * best)
            return ReplicaNumbers(best, busy, f"{results} ({model}, configuration '{configuration}')")
        print(f"{results} has no '{configuration}' rows of {model} with a throughput (run `python -m measure "
              "bench` on its export): using the figure measured in this project")
    return ReplicaNumbers(*MEASURED[configuration])


def autoscaling(device: str, numbers: ReplicaNumbers) -> dict:
    """Concurrency-based scaling: a new replica once each one holds the concurrency that saturates it."""
    target = GPU_TARGET_CONCURRENCY if device == "gpu" else numbers.saturating_concurrency
    return {"minReplicas": 1, "maxReplicas": MAX_REPLICAS, "scaleMetric": "concurrency", "scaleTarget": target}


def exported_archive(export_dir: Path, model_store: Path, model_name: str | None):
    """(the export's manifest, the model's name, its NAME.mar in model_store); DeployError saying what to pass
    when the archive is not there (model_name: default the model's own)."""
    from contract.records import Manifest
    manifest = Manifest.read(export_dir)
    model_name = model_name or manifest.model.name
    archive = Path(model_store) / f"{model_name}.mar"
    if not archive.is_file():
        raise DeployError(f"{archive} not found: export {export_dir}'s model with `--model-store {model_store}` "
                          f"(it writes {archive.name}), or pass --model-store / --model-name")
    return manifest, model_name, archive


def fresh_output(out: Path, force: bool) -> Path:
    """A temporary sibling folder to write into; `publish` renames it to `out` when complete."""
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not force:
        raise DeployError(f"{out} exists and is not empty; choose another folder or pass --force")
    staging = out.with_name(f".{out.name}.partial")
    if staging.exists():  # left by an interrupted run of this command
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    return staging


def publish(staging: Path, out: Path) -> Path:
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return out


def dump_yaml(documents: list[dict], header: str) -> str:
    import yaml
    return header + "\n---\n".join(yaml.safe_dump(d, sort_keys=False) for d in documents)


# KServe's InferenceService, the same for its TorchServe runtime (kserve.py) and our own predictor
# (kserve_predictor.py).
API_VERSION = "serving.kserve.io/v1beta1"
READINESS_SCRIPT = (  # a real prediction of a generated image, through KServe's v1 endpoint in the pod
    "import base64,io,json,urllib.request;from PIL import Image;b=io.BytesIO();"
    "Image.new('RGB',(64,64),(120,90,60)).save(b,'JPEG');"
    "d=json.dumps({'instances':[{'data':base64.b64encode(b.getvalue()).decode()}]}).encode();"
    "r=urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:8080/v1/models/MODEL_NAME:predict',d,"
    "{'Content-Type':'application/json'}),timeout=20);assert json.load(r)['predictions'][0]['predictions']")
RESOURCES = {
    "gpu": {"requests": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "1"},
            "limits": {"cpu": "8", "memory": "16Gi", "nvidia.com/gpu": "1"}},
    "cpu": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
}
