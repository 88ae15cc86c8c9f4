"""A Triton model repository for the served ONNX artifact, plus an InferenceService for KServe's Triton runtime.

    OUT/model_repository/NAME/config.pbtxt    platform onnxruntime_onnx, the ONNX file's own input/output
                                             names, dtypes and dims, dynamic batching, an instance group
    OUT/model_repository/NAME/1/model.onnx    the export's ONNX artifact (sha256 as in the manifest)
    OUT/inferenceservice-triton.yaml         KServe, modelFormat onnx, Open Inference Protocol (v2)

Triton runs the graph only: the JPEG -> tensor step happens in the client, with the project's own decoding
and the manifest's preprocessing contract (examples/clients/v2_client.py); normalisation is in the graph.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from export.selection import SERVING_PREFERENCE
from handlers.policy import GPU_BATCH_DELAY_MS, GPU_BATCH_SIZE
from runtime.integrity import verify_file
from serving.deploy_common import DeployError, dump_yaml, fresh_output, load_export, publish, replica_numbers

MAX_BATCH_SIZE = 32  # the largest batch the benchmarks run; the ONNX batch dimension is dynamic
PREFERRED_BATCH_SIZES = (GPU_BATCH_SIZE // 2, GPU_BATCH_SIZE)  # the serving policy's batch, and half of it
QUEUE_DELAY_US = GPU_BATCH_DELAY_MS * 1000  # the serving policy's batch delay
ONNX_TO_TRITON = {1: "TYPE_FP32", 10: "TYPE_FP16", 11: "TYPE_FP64", 7: "TYPE_INT64", 6: "TYPE_INT32",
                  2: "TYPE_UINT8", 3: "TYPE_INT8", 16: "TYPE_BF16", 9: "TYPE_BOOL"}
INSTANCE_KINDS = {"gpu": "KIND_GPU", "cpu": "KIND_CPU"}
STORAGE_URI_PLACEHOLDER = "pvc://vision-export-models/triton"


def served_onnx(manifest: dict) -> str:
    """The manifest's served artifact when it is ONNX, else the first servable ONNX of the preference."""
    servable = manifest["serving"].get("servable", [])
    onnx = [k for k in [manifest["serving"].get("default_artifact")] + list(SERVING_PREFERENCE)
            if k in servable and manifest["artifacts"][k]["format"] == "onnx"]
    if not onnx:
        raise DeployError("this export has no servable ONNX artifact, which Triton's onnxruntime backend needs")
    return onnx[0]


def tensor_spec(value_info) -> dict:
    """Name, Triton dtype and dims (without the batch dimension; -1 for a named dynamic one) of an ONNX I/O."""
    tensor = value_info.type.tensor_type
    dims = [d.dim_value if d.dim_value > 0 else -1 for d in tensor.shape.dim]
    return {"name": value_info.name, "data_type": ONNX_TO_TRITON[tensor.elem_type], "dims": dims[1:]}


def model_config(name: str, model_path: Path, kind: str) -> str:
    import onnx
    graph = onnx.load(str(model_path), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    inputs = [tensor_spec(v) for v in graph.input if v.name not in initializers]
    outputs = [tensor_spec(v) for v in graph.output]

    def block(spec: dict) -> str:
        return (f'  {{\n    name: "{spec["name"]}"\n    data_type: {spec["data_type"]}\n'
                f'    dims: [ {", ".join(map(str, spec["dims"]))} ]\n  }}')

    return "\n".join([
        f'name: "{name}"', 'platform: "onnxruntime_onnx"', f"max_batch_size: {MAX_BATCH_SIZE}",
        "input [", ",\n".join(block(s) for s in inputs), "]",
        "output [", ",\n".join(block(s) for s in outputs), "]",
        "dynamic_batching {",
        f"  preferred_batch_size: [ {', '.join(map(str, PREFERRED_BATCH_SIZES))} ]",
        f"  max_queue_delay_microseconds: {QUEUE_DELAY_US}", "}",
        f"instance_group [ {{ count: 1, kind: {INSTANCE_KINDS[kind]} }} ]", ""])


def triton_inference_service(name: str, storage_uri: str, kind: str) -> dict:
    resources = ({"requests": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"},
                  "limits": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "1"}} if kind == "gpu" else
                 {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}})
    numbers = replica_numbers()
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": f"{name}-triton", "annotations": {"vision-export/throughput-source": numbers.source}},
            "spec": {"predictor": {
                "minReplicas": 1, "maxReplicas": 8, "scaleMetric": "concurrency",
                "scaleTarget": 2 * GPU_BATCH_SIZE if kind == "gpu" else numbers.saturating_concurrency,
                "model": {"modelFormat": {"name": "onnx"}, "runtime": "kserve-tritonserver",
                          "protocolVersion": "v2", "storageUri": storage_uri, "resources": resources}}}}


def write_triton(out: Path, export_dir: Path, name: str = "resnet", kind: str = "gpu",
                 storage_uri: str = STORAGE_URI_PLACEHOLDER, force: bool = False) -> Path:
    if kind not in INSTANCE_KINDS:
        raise DeployError(f"--instance-kind must be one of {', '.join(INSTANCE_KINDS)}, got {kind!r}")
    manifest = load_export(export_dir)
    artifact = served_onnx(manifest)
    record = manifest["artifacts"][artifact]
    source = Path(export_dir) / record["path"]
    verify_file(source, record["sha256"], "re-run the export before deploying it")
    staging = fresh_output(Path(out), force)
    version = staging / "model_repository" / name / "1"
    version.mkdir(parents=True)
    shutil.copy2(source, version / "model.onnx")
    (version.parent / "config.pbtxt").write_text(
        f"# Triton model configuration for {manifest['model']['name']} ({artifact}), written by "
        f"`python -m serving triton`.\n" + model_config(name, version / "model.onnx", kind))
    (staging / "inferenceservice-triton.yaml").write_text(dump_yaml(
        [triton_inference_service(name, storage_uri, kind)],
        "# KServe InferenceService on the Triton runtime; storageUri holds model_repository/ (docs/scaling.md).\n"))
    return publish(staging, Path(out))
