"""`python -m serving triton`: the model repository parsed with Triton's own ModelConfig protobuf (from
tritonclient), its model run in ONNX Runtime with exactly the declared names and shapes, and the
InferenceService for KServe's Triton runtime validated like the TorchServe one."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from google.protobuf import text_format
from onnx import TensorProto, helper

from runtime.integrity import IntegrityError, file_sha256
from serving.deploy_common import DeployError, Measurements
from serving.triton import MAX_BATCH_SIZE, batching, model_config, pick_onnx, read_io
from tests.conftest import ROOT
from tests.serving.test_kserve import validate_inference_service

NUMBERS = Measurements(16.0, 2, 125.0, 0.73, "test figures")
TRITON_DTYPES = {"TYPE_FP32": np.float32}


def triton_model_config_class():
    """tritonclient's model_config_pb2 loaded alone: its grpc package registers protos that clash with
    KServe's in one process, and only the ModelConfig schema is needed here."""
    import tritonclient
    path = Path(tritonclient.__file__).parent / "grpc" / "model_config_pb2.py"
    spec = importlib.util.spec_from_file_location("triton_model_config_pb2", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_model_config(text: str):
    module = triton_model_config_class()
    config = module.ModelConfig()
    text_format.Parse(text, config)  # an unknown field or a wrong type raises ParseError
    return config, module


def tiny_onnx(path: Path, batch="N", input_name="input", output_name="output") -> Path:
    """N x 3 x H x W floats -> N x 3 (global average pool): the shape contract of an exported classifier."""
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", [input_name], ["pooled"]),
         helper.make_node("Flatten", ["pooled"], [output_name])], "tiny",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, [batch, 3, "H", "W"])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, [batch, 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


def tiny_manifest(folder: Path, default="onnx-dynamo", **files) -> dict:
    artifacts = {kind: {"path": path.name, "format": "onnx" if path.suffix == ".onnx" else "torchscript",
                        "sha256": file_sha256(path)} for kind, path in files.items()}
    return {"model": {"name": "tiny"}, "input": {"name": "input", "example_shape": [1, 3, 8, 8]},
            "output": {"name": "output", "shape": ["batch", 3]}, "artifacts": artifacts,
            "serving": {"default_artifact": default}}


# ------------------------------------------------------------------ pure parts
@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_model_config_parses_with_tritons_schema(tmp_path, device):
    model = tiny_onnx(tmp_path / "m.onnx")
    inputs, outputs = read_io(model, tiny_manifest(tmp_path, **{"onnx-dynamo": model}))
    config, schema = parse_model_config(model_config("tiny", inputs, outputs, device, batching(device, NUMBERS)))
    assert config.platform == "onnxruntime_onnx" and config.max_batch_size == MAX_BATCH_SIZE
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [("input", schema.TYPE_FP32, [3, -1, -1])]
    assert [(o.name, list(o.dims)) for o in config.output] == [("output", [3])]
    (group,) = config.instance_group
    assert group.kind == (schema.ModelInstanceGroup.KIND_GPU if device == "gpu" else schema.ModelInstanceGroup.KIND_CPU)
    assert config.HasField("dynamic_batching")
    if device == "gpu":  # target 16 = two batches of 8; a tenth of 125 ms
        assert list(config.dynamic_batching.preferred_batch_size) == [8, 16]
        assert config.dynamic_batching.max_queue_delay_microseconds == 12500
    else:  # 2 instances x 1 thread on the 2 cores a replica asks for; batching measured x0.73: no waiting
        assert group.count == 2 and config.parameters["intra_op_thread_count"].string_value == "1"
        assert config.dynamic_batching.max_queue_delay_microseconds == 0


def test_cpu_batching_waits_only_when_it_was_measured_to_pay():
    assert batching("cpu", Measurements(16.0, 4, 200.0, 1.5, "t")).queue_delay_us == 20000
    assert batching("cpu", Measurements(16.0, 4, 200.0, 1.0, "t")).queue_delay_us == 0


def test_tritons_schema_rejects_an_unknown_field_and_a_wrong_enum():
    assert parse_model_config('name: "m"\nmax_batch_size: 8')[0].max_batch_size == 8
    with pytest.raises(text_format.ParseError):
        parse_model_config('name: "m"\nmax_batch: 8')
    with pytest.raises(text_format.ParseError):
        parse_model_config('input [ { name: "x" data_type: TYPE_FLOAT32 dims: [ 3 ] } ]')


def test_pick_onnx_falls_back_from_a_torchscript_default_and_skips_a_fixed_batch(tmp_path):
    fixed, dynamic, script = tiny_onnx(tmp_path / "f.onnx", batch=1), tiny_onnx(tmp_path / "d.onnx"), tmp_path / "s.pt"
    script.write_bytes(b"not onnx")
    manifest = tiny_manifest(tmp_path, default="scripted", scripted=script, **{"onnx-traced": fixed,
                                                                                "onnx-scripted": dynamic})
    assert pick_onnx(manifest, tmp_path) == ("onnx-scripted", dynamic)
    del manifest["artifacts"]["onnx-scripted"]
    with pytest.raises(DeployError, match=r"no ONNX artifact with a dynamic batch.*onnx-traced \(fixed batch size\)"):
        pick_onnx(manifest, tmp_path)


def test_pick_onnx_checks_the_sha256(tmp_path):
    model = tiny_onnx(tmp_path / "d.onnx")
    manifest = tiny_manifest(tmp_path, **{"onnx-dynamo": model})
    manifest["artifacts"]["onnx-dynamo"]["sha256"] = "0" * 64
    with pytest.raises(IntegrityError, match="d.onnx"):
        pick_onnx(manifest, tmp_path)


def test_read_io_refuses_a_file_that_disagrees_with_its_manifest(tmp_path):
    model = tiny_onnx(tmp_path / "m.onnx", input_name="pixels")
    with pytest.raises(DeployError, match=r"inputs \['pixels'\] vs manifest input.name 'input'"):
        read_io(model, tiny_manifest(tmp_path, **{"onnx-dynamo": model}))
    model = tiny_onnx(tmp_path / "m.onnx")
    manifest = tiny_manifest(tmp_path, **{"onnx-dynamo": model})
    manifest["output"]["shape"] = ["batch", 1000]
    with pytest.raises(DeployError, match=r"output dims \[3\] vs manifest output.shape"):
        read_io(model, manifest)


# ------------------------------------------------------------------ the command on a real export
@pytest.fixture(scope="module")
def triton_out(resnet18_export, tmp_path_factory):
    out = tmp_path_factory.mktemp("deploy") / "triton"
    done = subprocess.run([sys.executable, "-m", "serving", "triton", str(out), "--export-dir",
                           str(resnet18_export["out"])], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return out


def run_as_declared(config, model: Path, batch: int, spatial: list[int]) -> np.ndarray:
    """Feed ONNX Runtime exactly the declared input (name, dtype, batch + dims) and ask for the declared output."""
    (declared_in,), (declared_out,) = config.input, config.output
    dims = [spatial.pop(0) if d == -1 else d for d in declared_in.dims]
    schema = triton_model_config_class()
    dtype = TRITON_DTYPES[schema.DataType.Name(declared_in.data_type)]
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    (result,) = session.run([declared_out.name], {declared_in.name: np.random.rand(batch, *dims).astype(dtype)})
    assert result.dtype == TRITON_DTYPES[schema.DataType.Name(declared_out.data_type)]
    assert list(result.shape) == [batch] + list(declared_out.dims)
    return result


@pytest.mark.slow
@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_triton_repository_parses_and_runs_as_declared(triton_out, resnet18_export, device):
    manifest = json.loads((resnet18_export["out"] / "manifest.json").read_text())
    folder = triton_out / device / "model_repository" / "resnet"
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == \
        ["1/model.onnx", "config.pbtxt"]
    text = (folder / "config.pbtxt").read_text()
    config, _ = parse_model_config(text)
    assert config.name == "resnet" and config.platform == "onnxruntime_onnx"
    assert re.search(r"^# Batching derived from: ", text, re.M)
    served = manifest["artifacts"][manifest["serving"]["default_artifact"]]
    assert hashlib.sha256((folder / "1" / "model.onnx").read_bytes()).hexdigest() == served["sha256"]
    assert config.input[0].name == manifest["input"]["name"] and config.output[0].name == manifest["output"]["name"]
    for batch in (1, max(config.dynamic_batching.preferred_batch_size)):
        run_as_declared(config, folder / "1" / "model.onnx", batch, manifest["input"]["example_shape"][2:])
    (document,) = yaml.safe_load_all((triton_out / device / "inferenceservice.yaml").read_text())
    model = validate_inference_service(document).spec.predictor.model
    assert model.model_format.name == "onnx" and model.protocol_version == "v2"
