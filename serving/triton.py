"""`python -m serving triton OUT`: a Triton model repository for the export's ONNX artifact, per device, and an
InferenceService for KServe's Triton runtime (model format `onnx`, Open Inference Protocol v2).

    python -m serving triton deploy/triton [--export-dir artifacts/resnet50] [--model-name resnet] [--force]

    OUT/{gpu,cpu}/model_repository/NAME/config.pbtxt   platform onnxruntime_onnx; the ONNX file's own input and
                                                      output names, dtypes and dims; max_batch_size; dynamic
                                                      batching from the measurements; an instance group
    OUT/{gpu,cpu}/model_repository/NAME/1/model.onnx  the export's ONNX artifact (sha256 checked first)
    OUT/{gpu,cpu}/inferenceservice.yaml               KServe, modelFormat onnx, runtime kserve-tritonserver

Triton runs the graph only: the JPEG -> tensor step (decode, the manifest's resize and centre crop, RGB
floats in [0, 1]) happens in the client (examples/clients/v2_client.py); normalisation is inside the graph.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from handlers.policy import machine_policy
from runtime.integrity import verify_file
from serving.deploy_common import (BATCHING_WORTH_IT, CPU_REPLICA_CORES, DeployError, Measurements, dump_yaml,
                                   link_or_copy, measurements, read_manifest, scale_target, staged_output)

API_VERSION = "serving.kserve.io/v1beta1"
TRITON_RUNTIME = "kserve-tritonserver"
STORAGE_URI_PLACEHOLDER = "pvc://vision-export-models/triton-{device}"
ONNX_KINDS = ("onnx-dynamo", "onnx-scripted", "onnx-traced")  # the exports with a dynamic batch dimension
MAX_BATCH_SIZE = 32  # largest batch Triton may form; the ONNX batch dimension is dynamic
QUEUE_DELAY_FRACTION = 0.1  # waiting to fill a batch may add at most a tenth of one request's measured time
MIN_REPLICAS, MAX_REPLICAS = 1, 8
ONNX_TO_TRITON = {1: "TYPE_FP32", 10: "TYPE_FP16", 11: "TYPE_FP64", 7: "TYPE_INT64", 6: "TYPE_INT32",
                  2: "TYPE_UINT8", 3: "TYPE_INT8", 16: "TYPE_BF16", 9: "TYPE_BOOL"}
INSTANCE_KINDS = {"gpu": "KIND_GPU", "cpu": "KIND_CPU"}
RESOURCES = {
    "gpu": {"requests": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"},
            "limits": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "1"}},
    "cpu": {"requests": {"cpu": str(CPU_REPLICA_CORES), "memory": "4Gi"},
            "limits": {"cpu": str(CPU_REPLICA_CORES), "memory": "4Gi"}},
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    data_type: str  # Triton's TYPE_*
    dims: tuple[int, ...]  # without the batch dimension; -1 where the ONNX file has a symbolic size


@dataclass(frozen=True)
class Batching:
    preferred: tuple[int, ...]
    queue_delay_us: int
    reason: str


def pick_onnx(manifest: dict, export_dir: Path) -> tuple[str, Path]:
    """The manifest's served artifact when it is ONNX with a dynamic batch dimension, else the first such
    ONNX artifact of the export; its sha256 is checked against the manifest."""
    artifacts = manifest["artifacts"]
    default = (manifest.get("serving") or {}).get("default_artifact")
    ordered = [default] + [k for k in ONNX_KINDS if k != default] + [k for k in artifacts if k not in ONNX_KINDS]
    tried = []
    for kind in dict.fromkeys(k for k in ordered if k in artifacts and artifacts[k].get("format") == "onnx"):
        path = Path(export_dir) / artifacts[kind]["path"]
        if not path.is_file():
            tried.append(f"{kind} ({path} is missing)")
        elif not batch_is_dynamic(path):
            tried.append(f"{kind} (fixed batch size)")
        else:
            verify_file(path, artifacts[kind]["sha256"], "re-run the export before deploying it")
            return kind, path
    raise DeployError("this export has no ONNX artifact with a dynamic batch dimension, which Triton's batching "
                      f"needs ({'; '.join(tried) or 'no ONNX artifact at all'}): run `python -m export resnet`")


def _graph(path: Path):
    import onnx
    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    return [v for v in graph.input if v.name not in initializers], list(graph.output)


def batch_is_dynamic(path: Path) -> bool:
    inputs, _ = _graph(path)
    return all(v.type.tensor_type.shape.dim and not v.type.tensor_type.shape.dim[0].HasField("dim_value")
               for v in inputs)


def tensor_spec(value_info) -> TensorSpec:
    tensor = value_info.type.tensor_type
    if tensor.elem_type not in ONNX_TO_TRITON:
        raise DeployError(f"ONNX tensor {value_info.name!r} has element type {tensor.elem_type}, which this "
                          "writer does not map to a Triton type")
    dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
    return TensorSpec(value_info.name, ONNX_TO_TRITON[tensor.elem_type], dims[1:])


def read_io(path: Path, manifest: dict) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Names, dtypes and dims from the ONNX file, cross-checked against the manifest's contract."""
    inputs, outputs = (list(map(tensor_spec, values)) for values in _graph(path))
    declared_in, declared_out = manifest["input"], manifest["output"]
    example = list(declared_in.get("example_shape", []))
    problems = []
    if [s.name for s in inputs] != [declared_in["name"]]:
        problems.append(f"inputs {[s.name for s in inputs]} vs manifest input.name {declared_in['name']!r}")
    elif len(inputs[0].dims) + 1 != len(example) or any(
            d not in (-1, e) for d, e in zip(inputs[0].dims, example[1:])):
        problems.append(f"input dims {list(inputs[0].dims)} do not take manifest input.example_shape {example}")
    if [s.name for s in outputs] != [declared_out["name"]]:
        problems.append(f"outputs {[s.name for s in outputs]} vs manifest output.name {declared_out['name']!r}")
    elif [d for d in declared_out.get("shape", [])[1:]] != list(outputs[0].dims):
        problems.append(f"output dims {list(outputs[0].dims)} vs manifest output.shape {declared_out.get('shape')}")
    if problems:
        raise DeployError(f"{path.name} and its manifest disagree: {'; '.join(problems)}; re-run the export")
    return inputs, outputs


def batching(device: str, numbers: Measurements) -> Batching:
    """Preferred sizes: the batches a replica held at its autoscaling target can form (all requests in flight,
    or half while the other half runs). Queue delay: a tenth of one request's measured time, and none on a CPU
    where batching measured no gain (Triton then batches only what is already queued, never waits)."""
    target = scale_target(device, numbers)
    preferred = tuple(sorted({s for s in (target // 2, target) if 2 <= s <= MAX_BATCH_SIZE}))
    delay = round(QUEUE_DELAY_FRACTION * numbers.service_ms * 1000)
    if device == "cpu" and numbers.batching_gain < BATCHING_WORTH_IT:
        return Batching(preferred, 0, f"batching gained x{numbers.batching_gain:.2f} on a CPU: no queue delay")
    return Batching(preferred, delay, f"{QUEUE_DELAY_FRACTION:.0%} of a request's {numbers.service_ms:.0f} ms"
                    + (" (measured on a CPU: an upper bound for a GPU)" if device == "gpu" else ""))


def _tensor_block(spec: TensorSpec) -> str:
    return (f'  {{\n    name: "{spec.name}"\n    data_type: {spec.data_type}\n'
            f'    dims: [ {", ".join(map(str, spec.dims))} ]\n  }}')


def model_config(name: str, inputs: list[TensorSpec], outputs: list[TensorSpec], device: str,
                 batch: Batching) -> str:
    lines = [f'name: "{name}"', 'platform: "onnxruntime_onnx"', f"max_batch_size: {MAX_BATCH_SIZE}",
             "input [", ",\n".join(map(_tensor_block, inputs)), "]",
             "output [", ",\n".join(map(_tensor_block, outputs)), "]",
             f"# {batch.reason}", "dynamic_batching {"]
    if batch.preferred:
        lines.append(f"  preferred_batch_size: [ {', '.join(map(str, batch.preferred))} ]")
    lines += [f"  max_queue_delay_microseconds: {batch.queue_delay_us}", "}"]
    if device == "gpu":
        lines.append("instance_group [ { count: 1, kind: KIND_GPU } ]")
    else:  # the project's CPU policy for the replica's cores: instances x threads never exceeds them
        policy = machine_policy(0, CPU_REPLICA_CORES)
        lines += [f"# {policy.reason}; {policy.threads_per_worker} thread(s) each",
                  f"instance_group [ {{ count: {policy.workers}, kind: KIND_CPU }} ]",
                  f'parameters {{ key: "intra_op_thread_count" value: {{ string_value: "{policy.threads_per_worker}" }} }}',
                  'parameters { key: "inter_op_thread_count" value: { string_value: "1" } }']
    return "\n".join(lines) + "\n"


def inference_service(name: str, device: str, numbers: Measurements, storage_uri: str) -> dict:
    return {"apiVersion": API_VERSION, "kind": "InferenceService",
            "metadata": {"name": f"{name}-triton-{device}",
                         "annotations": {"vision-export/throughput-source": numbers.source}},
            "spec": {"predictor": {
                "minReplicas": MIN_REPLICAS, "maxReplicas": MAX_REPLICAS, "scaleMetric": "concurrency",
                "scaleTarget": scale_target(device, numbers),
                "model": {"modelFormat": {"name": "onnx"}, "runtime": TRITON_RUNTIME, "protocolVersion": "v2",
                          "storageUri": storage_uri, "resources": RESOURCES[device]}}}}


def write_triton(out: Path, export_dir: Path, name: str = "resnet", storage_uri: str = STORAGE_URI_PLACEHOLDER,
                 force: bool = False, results: Path | None = None) -> Path:
    manifest = read_manifest(export_dir)
    kind, source = pick_onnx(manifest, export_dir)
    inputs, outputs = read_io(source, manifest)
    numbers = measurements(results)
    with staged_output(out, force) as staging:
        first = None
        for device in ("gpu", "cpu"):
            folder = staging / device / "model_repository" / name
            (folder / "1").mkdir(parents=True)
            link_or_copy(first or source, folder / "1" / "model.onnx")
            first = first or folder / "1" / "model.onnx"
            (folder / "config.pbtxt").write_text(
                f"# Triton model configuration: {manifest['model']['name']} ({kind}), {device}, written by "
                f"`python -m serving triton`.\n# Batching derived from: {numbers.source}.\n"
                + model_config(name, inputs, outputs, device, batching(device, numbers)))
            (staging / device / "inferenceservice.yaml").write_text(dump_yaml(
                [inference_service(name, device, numbers, storage_uri.format(model=name, device=device))],
                f"# KServe InferenceService on the Triton runtime ({device}), written by `python -m serving triton`.\n"
                "# storageUri is a placeholder for where model_repository/ will live (docs/scaling.md).\n"
                f"# Autoscaling target (scaleTarget) from: {numbers.source}.\n"))
    return Path(out)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m serving triton", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="folder to write (must not exist or be empty, unless --force)")
    parser.add_argument("--export-dir", type=Path, default=Path("artifacts/resnet50"))
    parser.add_argument("--model-name", default="resnet", help="the Triton model's name (its folder, its URL)")
    parser.add_argument("--storage-uri", default=STORAGE_URI_PLACEHOLDER,
                        help="where each model_repository/ will live; {model} and {device} are filled in")
    parser.add_argument("--bench-results", type=Path, default=None,
                        help="the serving benchmark's results.json (default: bench-results/results.json if present)")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")
    return parser.parse_args(argv)


def _main(argv: list[str]) -> int:
    args = parse(argv)
    out = write_triton(args.out, args.export_dir, args.model_name, args.storage_uri, args.force, args.bench_results)
    print(f"wrote {out}/: gpu/ and cpu/ (model_repository/{args.model_name}/ with config.pbtxt and 1/model.onnx, "
          "inferenceservice.yaml each); next: docs/scaling.md")
    return 0


def main(argv: list[str] | None = None) -> int:
    from export.cli import run_command
    return run_command(lambda: _main(sys.argv[1:] if argv is None else list(argv)))
