"""KServe's TorchServe runtime (model format `pytorch`): the storage layout and the InferenceServices.

Storage layout KServe expects at the storageUri: config/config.properties + model-store/NAME.mar. The
config speaks KServe's v1 protocol through TorchServe's `kserve` request envelope, so a request
{"instances": [{"data": "<base64 image>"}]} reaches our handler as {"data": ...} and the answer comes
back as {"predictions": [...]}. Written, per device (gpu/, cpu/: the worker count differs, so each has
its own config): storage/ and inferenceservice.yaml; and storage-pvc.yaml (a PersistentVolumeClaim plus
a helper Pod to copy the storage folders onto it).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from contract.policy import MAX_BODY_BYTES, Machine, PolicyChoices, ServingPolicy, resolve_policy
from contract.versions import UNVERSIONED_ARCHIVE, label_of
from serving.deploy.common import (
    API_VERSION,
    READINESS_SCRIPT,
    RESOURCES,
    DeployError,
    ReplicaNumbers,
    autoscaling,
    dump_yaml,
    exported_archive,
    fresh_output,
    publish,
    replica_numbers,
)
from serving.deploy.kserve_predictor import scrape_annotations, write_engine_material
from serving.settings import archive_version, torchserve_version
from serving.torchserve.config import METRICS_PORT

STORAGE_URI_PLACEHOLDER = "pvc://vision-export-models/{model}-{device}"  # docs/scaling.md: or s3://BUCKET/...
VERSION_ANNOTATION = "vision-export/model-version"  # the archive's version (contract/versions.py), vN
PVC_NAME = "vision-export-models"
KSERVE_PORT = 8085  # TorchServe's port behind KServe's wrapper (KServe's documented layout)


def pod_policy(device: str) -> ServingPolicy:
    """The serving policy of the pod RESOURCES requests for device (GPU: one worker; CPU: a worker per core of
    the request), without batching: KServe's envelope takes one request per call."""
    requests = RESOURCES[device]["requests"]
    return resolve_policy(Machine(int(requests.get("nvidia.com/gpu", 0)), int(requests["cpu"])),
                          flags=PolicyChoices(batch_size=1, why="KServe's envelope takes one request per call"))


def kserve_config_properties(model_name: str, mar_name: str, device: str, ts_version: str = UNVERSIONED_ARCHIVE) -> str:
    """TorchServe's config for KServe: env-var overrides, the v1 envelope, and the model's startup settings
    (pod_policy) under the archive's own TorchServe version."""
    policy = pod_policy(device)
    snapshot = {"name": "startup.cfg", "modelCount": 1, "models": {model_name: {ts_version: {
        "defaultVersion": True, "marName": mar_name, **policy.model_config(), "responseTimeout": 120}}}}
    return "\n".join([
        "# TorchServe config for KServe's pytorch (TorchServe) runtime, written by `python -m serving deploy kserve`.",
        *(f"# Serving policy of the pod: {line}" for line in policy.lines()),
        f"inference_address=http://0.0.0.0:{KSERVE_PORT}",
        f"management_address=http://127.0.0.1:{KSERVE_PORT + 1}",  # the pod's own processes only: never a Service
        f"metrics_address=http://0.0.0.0:{METRICS_PORT}",
        "grpc_inference_port=7070",
        "grpc_management_port=7071",
        "enable_envvars_config=true",
        "enable_metrics_api=true",
        "metrics_mode=prometheus",
        "model_metrics_auto_detect=true",
        "service_envelope=kserve",
        "enable_model_api=false",
        f"max_request_size={MAX_BODY_BYTES}",  # the one body limit of every engine
        "max_response_size=8388608",
        "job_queue_size=100",
        "model_store=/mnt/models/model-store",
        f"model_snapshot={json.dumps(snapshot)}",
        ""])


def inference_service(model_name: str, device: str, numbers: ReplicaNumbers, storage_uri: str) -> dict:
    name = f"{model_name}-{device}"
    return {
        "apiVersion": API_VERSION,
        "kind": "InferenceService",
        "metadata": {"name": name, "annotations": {
            "vision-export/throughput-source": numbers.source,
            "vision-export/replica-requests-per-second": f"{numbers.requests_per_s:.1f}",
            **scrape_annotations(METRICS_PORT)}},  # TorchServe's own metrics port in this runtime's config
        "spec": {"predictor": {
            **autoscaling(device, numbers),
            "model": {
                "modelFormat": {"name": "pytorch"},
                "protocolVersion": "v1",
                "storageUri": storage_uri,
                "resources": RESOURCES[device],
                "readinessProbe": {"exec": {"command": ["python3", "-c", READINESS_SCRIPT.replace("MODEL_NAME", model_name)]},
                                   "initialDelaySeconds": 20, "periodSeconds": 30, "timeoutSeconds": 25},
                # TorchServe's frontend answers (its /ping); readiness above asks a real prediction of the model
                "livenessProbe": {"httpGet": {"path": "/ping", "port": KSERVE_PORT}, "initialDelaySeconds": 30,
                                  "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6},
            }}},
    }


def storage_upload_objects(mar_bytes: int) -> list[dict]:
    """A PVC for the storage layout and a Pod to `kubectl cp` it onto the claim (KServe's PVC recipe)."""
    size = f"{max(1, math.ceil(mar_bytes * 3 / 2**30))}Gi"
    return [
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": PVC_NAME},
         "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{PVC_NAME}-upload"},
         "spec": {"containers": [{"name": "upload", "image": "busybox:1.36", "command": ["sleep", "3600"],
                                  "volumeMounts": [{"name": "models", "mountPath": "/pv"}]}],
                  "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": PVC_NAME}}]}},
    ]


def versioned(service: dict, version: str, canary_percent: int | None) -> dict:
    """The InferenceService naming the archive's version; with canary_percent, KServe's canaryTrafficPercent: applied
    over the running service, that share of requests goes to the new revision until it is raised to 100."""
    service["metadata"]["annotations"][VERSION_ANNOTATION] = version
    if canary_percent is not None:
        if not 0 <= canary_percent <= 100:
            raise DeployError(f"--canary-percent {canary_percent}: give a share of requests from 0 to 100")
        service["spec"]["predictor"]["canaryTrafficPercent"] = canary_percent
    return service


def write_kserve(out: Path, export_dir: Path, model_store: Path, model_name: str | None = None,
                 storage_uri: str = STORAGE_URI_PLACEHOLDER, force: bool = False,
                 canary_percent: int | None = None) -> Path:
    """gpu/ and cpu/ storage folders with the export's archive (model_name: default the model's name); each
    InferenceService names the archive's version (and a canary share, canary_percent)."""
    manifest, model_name, archive = exported_archive(export_dir, model_store, model_name)
    version = label_of(archive_version(archive))
    numbers = replica_numbers(manifest.model.name)
    staging = fresh_output(Path(out), force)
    header = (f"# KServe InferenceService for {manifest.model.name} ({manifest.served_record().kind}) served by "
              "TorchServe (written by `python -m serving deploy kserve`).\n"
              "# storageUri is a placeholder: copy storage/ there (docs/scaling.md).\n"
              f"# Autoscaling target from: {numbers.source}.\n")
    for device in ("gpu", "cpu"):
        storage = staging / device / "storage"
        (storage / "config").mkdir(parents=True)
        (storage / "model-store").mkdir()
        _link_or_copy(archive, storage / "model-store" / archive.name)
        (storage / "config" / "config.properties").write_text(kserve_config_properties(
            model_name, archive.name, device, torchserve_version(archive) or UNVERSIONED_ARCHIVE))
        uri = storage_uri.format(model=model_name, device=device, version=version)
        (staging / device / "inferenceservice.yaml").write_text(
            dump_yaml([versioned(inference_service(model_name, device, numbers, uri), version, canary_percent)],
                      header))

    write_engine_material(staging, archive, model_name, storage_uri.replace("{version}", version), _link_or_copy,
                          lambda service: versioned(service, version, canary_percent))
    (staging / "storage-pvc.yaml").write_text(dump_yaml(
        storage_upload_objects(archive.stat().st_size),
        "# A claim to hold the storage folders, and a pod to copy them there:\n# kubectl apply -f storage-pvc.yaml; "
        f"kubectl cp gpu/storage/. {PVC_NAME}-upload:/pv/{model_name}-gpu\n"))
    return publish(staging, Path(out))


def _link_or_copy(source: Path, target: Path) -> None:
    """Both device folders hold the same archive: a hard link where the file system allows it."""
    try:
        target.hardlink_to(source)
    except OSError:
        shutil.copy2(source, target)
