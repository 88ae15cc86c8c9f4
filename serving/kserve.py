"""`python -m serving kserve OUT`: material for KServe's TorchServe runtime (model format `pytorch`).

    python -m serving kserve deploy/kserve [--export-dir artifacts/resnet50] [--model-store model-store]
                                           [--storage-uri URI] [--force]

Written per device (OUT/gpu/, OUT/cpu/: the worker count differs, so each has its own config):
    storage/config/config.properties   what KServe's runtime reads at /mnt/models/config/
    storage/model-store/resnet.mar     the archive `python -m export` built (hard link or copy)
    inferenceservice.yaml              serving.kserve.io/v1beta1, modelFormat pytorch, protocol v1
and OUT/storage-pvc.yaml: a PersistentVolumeClaim and a pod to copy the storage folders onto it.

KServe's v1 protocol reaches our handler through TorchServe's `kserve` request envelope: a request
{"instances": [{"data": "<base64 image>"}]} becomes {"data": ...} for the handler, and the answer comes back
as {"predictions": [<the handler's answer>]}. The envelope reads only the first request of a TorchServe
batch, so every worker here takes batches of 1 (several images go as several instances of one request).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from handlers.policy import THREADS_ENV, ServingPolicy, machine_policy, with_overrides
from serving.deploy_common import (CPU_REPLICA_CORES, DeployError, Measurements, dump_yaml, link_or_copy, measurements,
                                   read_manifest, scale_target, staged_output)

API_VERSION = "serving.kserve.io/v1beta1"
STORAGE_URI_PLACEHOLDER = "pvc://vision-export-models/{model}-{device}"  # docs/scaling.md: or s3://BUCKET/...
PVC_NAME = "vision-export-models"
TORCHSERVE_PORT = 8085  # where KServe's wrapper in the runtime image expects TorchServe (its documented layout)
KSERVE_PORT = 8080  # the wrapper's own v1 endpoint inside the pod
STORAGE_MOUNT = "/mnt/models"  # where KServe's storage initializer puts storageUri's content
MIN_REPLICAS = 1
MAX_REPLICAS = 8
GPU_REPLICA_CORES = 4
RESPONSE_TIMEOUT_S = 120
RESOURCES = {
    "gpu": {"requests": {"cpu": str(GPU_REPLICA_CORES), "memory": "8Gi", "nvidia.com/gpu": "1"},
            "limits": {"cpu": str(2 * GPU_REPLICA_CORES), "memory": "16Gi", "nvidia.com/gpu": "1"}},
    # requests = limits: a replica gets exactly the cores the measurements were taken on (Guaranteed QoS)
    "cpu": {"requests": {"cpu": str(CPU_REPLICA_CORES), "memory": "4Gi"},
            "limits": {"cpu": str(CPU_REPLICA_CORES), "memory": "4Gi"}},
}
READINESS_SCRIPT = (  # a real prediction of a generated image, through KServe's v1 endpoint in the pod
    "import base64,io,json,urllib.request;from PIL import Image;b=io.BytesIO();"
    "Image.new('RGB',(64,64),(120,90,60)).save(b,'JPEG');"
    "d=json.dumps({'instances':[{'data':base64.b64encode(b.getvalue()).decode()}]}).encode();"
    f"r=urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:{KSERVE_PORT}/v1/models/MODEL_NAME:predict',d,"
    "{'Content-Type':'application/json'}),timeout=20);assert json.load(r)['predictions'][0]['predictions']")


def replica_policy(device: str) -> ServingPolicy:
    """The project's serving policy for the cores a replica asks for; batches of 1 (the envelope's limit)."""
    policy = machine_policy(1, GPU_REPLICA_CORES) if device == "gpu" else machine_policy(0, CPU_REPLICA_CORES)
    return with_overrides(policy, batch_size=1)


def config_properties(model_name: str, mar_name: str, device: str) -> str:
    """TorchServe's config as KServe runs it: env-var overrides on, the v1 envelope, the model in
    `model_snapshot` (KServe's wrapper reads the model names from it; TorchServe loads the model from it)."""
    policy = replica_policy(device)
    snapshot = {"name": "startup.cfg", "modelCount": 1, "models": {model_name: {"1.0": {
        "defaultVersion": True, "marName": mar_name, **policy.model_config(), "responseTimeout": RESPONSE_TIMEOUT_S}}}}
    return "\n".join([
        f"# TorchServe config for KServe's pytorch (TorchServe) runtime, {device} replica: {policy.reason}.",
        "# Written by `python -m serving kserve`. Every key can be overridden by a TS_* environment variable.",
        f"inference_address=http://0.0.0.0:{TORCHSERVE_PORT}",
        f"management_address=http://0.0.0.0:{TORCHSERVE_PORT + 1}",
        "metrics_address=http://0.0.0.0:8082",
        "grpc_inference_port=7070",
        "grpc_management_port=7071",
        "enable_envvars_config=true",
        "install_py_dep_per_model=true",
        "service_envelope=kserve",
        "metrics_mode=prometheus",
        "enable_metrics_api=true",
        "enable_model_api=false",
        "max_request_size=8388608",
        "max_response_size=8388608",
        "job_queue_size=100",
        f"model_store={STORAGE_MOUNT}/model-store",
        f"model_snapshot={json.dumps(snapshot)}",
        ""])


def autoscaling(device: str, numbers: Measurements) -> dict:
    return {"minReplicas": MIN_REPLICAS, "maxReplicas": MAX_REPLICAS, "scaleMetric": "concurrency",
            "scaleTarget": scale_target(device, numbers)}


def inference_service(model_name: str, device: str, numbers: Measurements, storage_uri: str) -> dict:
    policy = replica_policy(device)
    return {
        "apiVersion": API_VERSION,
        "kind": "InferenceService",
        "metadata": {"name": f"{model_name}-{device}", "annotations": {
            "vision-export/throughput-source": numbers.source,
            "vision-export/replica-requests-per-second": f"{numbers.replica_rps:.1f}"}},
        "spec": {"predictor": {
            **autoscaling(device, numbers),
            "model": {
                "modelFormat": {"name": "pytorch"},
                "protocolVersion": "v1",
                "storageUri": storage_uri,
                "env": [{"name": THREADS_ENV, "value": str(policy.threads_per_worker)}],
                "resources": RESOURCES[device],
                "readinessProbe": {
                    "exec": {"command": ["python3", "-c", READINESS_SCRIPT.replace("MODEL_NAME", model_name)]},
                    "initialDelaySeconds": 20, "periodSeconds": 30, "timeoutSeconds": 25, "failureThreshold": 3},
            }}},
    }


def storage_upload_objects(mar_bytes: int) -> list[dict]:
    """A claim for the storage folders and a pod to `kubectl cp` them onto it (KServe's PVC recipe)."""
    size = f"{max(1, math.ceil(mar_bytes * 3 / 2**30))}Gi"  # both devices' archives, and room to replace one
    return [
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": PVC_NAME},
         "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{PVC_NAME}-upload"},
         "spec": {"containers": [{"name": "upload", "image": "busybox:1.36", "command": ["sleep", "3600"],
                                  "volumeMounts": [{"name": "models", "mountPath": "/pv"}]}],
                  "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": PVC_NAME}}]}},
    ]


def yaml_header(model: str, device: str, numbers: Measurements) -> str:
    return (f"# KServe InferenceService: {model} on TorchServe ({device}), written by `python -m serving kserve`.\n"
            "# storageUri is a placeholder: copy storage/ there and edit it (docs/scaling.md).\n"
            f"# Autoscaling target (scaleTarget) from: {numbers.source}.\n")


def write_kserve(out: Path, export_dir: Path, model_store: Path, model_name: str = "resnet",
                 storage_uri: str = STORAGE_URI_PLACEHOLDER, force: bool = False,
                 results: Path | None = None) -> Path:
    manifest = read_manifest(export_dir)
    archive = Path(model_store) / f"{model_name}.mar"
    if not archive.is_file():
        raise DeployError(f"{archive} not found: run `python -m export resnet` (it writes the archive) first")
    numbers = measurements(results)
    with staged_output(out, force) as staging:
        for device in ("gpu", "cpu"):
            storage = staging / device / "storage"
            (storage / "config").mkdir(parents=True)
            (storage / "model-store").mkdir()
            link_or_copy(archive, storage / "model-store" / archive.name)
            (storage / "config" / "config.properties").write_text(config_properties(model_name, archive.name, device))
            service = inference_service(model_name, device, numbers, storage_uri.format(model=model_name, device=device))
            (staging / device / "inferenceservice.yaml").write_text(
                dump_yaml([service], yaml_header(manifest["model"]["name"], device, numbers)))
        (staging / "storage-pvc.yaml").write_text(dump_yaml(
            storage_upload_objects(archive.stat().st_size),
            "# A claim to hold the storage folders, and a pod to copy them there (docs/scaling.md):\n"
            f"#   kubectl apply -f storage-pvc.yaml\n#   kubectl cp gpu/storage/. {PVC_NAME}-upload:/pv/{model_name}-gpu\n"))
    return Path(out)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m serving kserve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="folder to write (must not exist or be empty, unless --force)")
    parser.add_argument("--export-dir", type=Path, default=Path("artifacts/resnet50"))
    parser.add_argument("--model-store", type=Path, default=Path("model-store"))
    parser.add_argument("--model-name", default="resnet")
    parser.add_argument("--storage-uri", default=STORAGE_URI_PLACEHOLDER,
                        help="where each storage folder will live; {model} and {device} are filled in")
    parser.add_argument("--bench-results", type=Path, default=None,
                        help="the serving benchmark's results.json (default: bench-results/results.json if present)")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")
    return parser.parse_args(argv)


def _main(argv: list[str]) -> int:
    args = parse(argv)
    out = write_kserve(args.out, args.export_dir, args.model_store, args.model_name, args.storage_uri, args.force,
                       args.bench_results)
    print(f"wrote {out}/: gpu/ and cpu/ (storage/ + inferenceservice.yaml each) and storage-pvc.yaml; "
          "next: docs/scaling.md")
    return 0


def main(argv: list[str] | None = None) -> int:
    from export.cli import run_command
    return run_command(lambda: _main(sys.argv[1:] if argv is None else list(argv)))
