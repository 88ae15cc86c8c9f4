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

from contract.policy import GPU_BATCH_DELAY_MS, GPU_BATCH_SIZE
from contract.records import ArtifactRecord, Manifest
from runtime.integrity import verify_file
from serving.deploy.common import DeployError, autoscaling, dump_yaml, fresh_output, publish, replica_numbers

MAX_BATCH_SIZE = 32  # the largest batch the benchmarks run; the ONNX batch dimension is dynamic
PREFERRED_BATCH_SIZES = (GPU_BATCH_SIZE // 2, GPU_BATCH_SIZE)  # the serving policy's batch, and half of it
QUEUE_DELAY_US = GPU_BATCH_DELAY_MS * 1000  # the serving policy's batch delay
ONNX_TO_TRITON = {1: "TYPE_FP32", 10: "TYPE_FP16", 11: "TYPE_FP64", 7: "TYPE_INT64", 6: "TYPE_INT32",
                  2: "TYPE_UINT8", 3: "TYPE_INT8", 16: "TYPE_BF16", 9: "TYPE_BOOL"}
INSTANCE_KINDS = {"gpu": "KIND_GPU", "cpu": "KIND_CPU"}
RESOURCES = {"gpu": {"requests": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"},
                     "limits": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "1"}},
             "cpu": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}}
STORAGE_URI_PLACEHOLDER = "pvc://vision-export-models/triton"


def served_onnx(manifest: Manifest) -> ArtifactRecord:
    """The artifact the export decided to serve, which Triton's onnxruntime backend can run only if it is ONNX."""
    record = manifest.served_record()
    if record.format != "onnx":
        onnx = [k for k in manifest.decision().servable if manifest.artifacts[k].format == "onnx"]
        hint = (f"re-export with `--serve {onnx[0]}` (servable ONNX here: {', '.join(onnx)})" if onnx else
                "this export has no servable ONNX artifact; re-export with an ONNX kind that passes parity")
        raise DeployError(f"the export serves {record.kind} ({record.format}), but Triton's onnxruntime backend "
                          f"needs ONNX: {hint}")
    return record


def check_names(specs: list[dict], expected: str, side: str) -> None:
    """The ONNX graph's single input/output must carry the manifest's name (what clients send and read)."""
    names = [spec["name"] for spec in specs]
    if names != [expected]:
        raise DeployError(f"the ONNX file's {side}s are {names}, the manifest says {expected!r}; re-run the export")


def tensor_spec(value_info) -> dict:
    """Name, Triton dtype and dims (without the batch dimension; -1 for a named dynamic one) of an ONNX I/O."""
    tensor = value_info.type.tensor_type
    dims = [d.dim_value if d.dim_value > 0 else -1 for d in tensor.shape.dim]
    return {"name": value_info.name, "data_type": ONNX_TO_TRITON[tensor.elem_type], "dims": dims[1:]}


def model_config(name: str, model_path: Path, kind: str, manifest: Manifest) -> str:
    import onnx
    graph = onnx.load(str(model_path), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    inputs = [tensor_spec(v) for v in graph.input if v.name not in initializers]
    outputs = [tensor_spec(v) for v in graph.output]
    check_names(inputs, manifest.input.name, "input")
    check_names(outputs, manifest.output.name, "output")

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


def triton_inference_service(name: str, storage_uri: str, kind: str, model: str) -> dict:
    numbers = replica_numbers(model)
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": f"{name}-triton", "annotations": {"vision-export/throughput-source": numbers.source}},
            "spec": {"predictor": {
                **autoscaling(kind, numbers),
                "model": {"modelFormat": {"name": "onnx"}, "runtime": "kserve-tritonserver",
                          "protocolVersion": "v2", "storageUri": storage_uri, "resources": RESOURCES[kind]}}}}


def write_triton(out: Path, export_dir: Path, name: str | None = None, kind: str = "gpu",
                 storage_uri: str = STORAGE_URI_PLACEHOLDER, force: bool = False) -> Path:
    """OUT/model_repository/NAME/ for the export's served ONNX artifact (name: default the model's name)."""
    if kind not in INSTANCE_KINDS:
        raise DeployError(f"--instance-kind must be one of {', '.join(INSTANCE_KINDS)}, got {kind!r}")
    manifest = Manifest.read(export_dir)
    name = name or manifest.model.name
    record = served_onnx(manifest)
    source = Path(export_dir) / record.path
    verify_file(source, record.sha256, "re-run the export before deploying it")
    staging = fresh_output(Path(out), force)
    version = staging / "model_repository" / name / "1"
    version.mkdir(parents=True)
    shutil.copy2(source, version / "model.onnx")
    (version.parent / "config.pbtxt").write_text(
        f"# Triton model configuration for {manifest.model.name} ({record.kind}), written by "
        f"`python -m serving deploy triton`.\n" + model_config(name, version / "model.onnx", kind, manifest))
    (staging / "inferenceservice-triton.yaml").write_text(dump_yaml(
        [triton_inference_service(name, storage_uri, kind, manifest.model.name)],
        "# KServe InferenceService on the Triton runtime; storageUri holds model_repository/ (docs/scaling.md).\n"))
    return publish(staging, Path(out))
