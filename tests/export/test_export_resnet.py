"""`python -m export resnet` on resnet18 with random weights: every artifact, checked by loading it."""

import hashlib
import json
import zipfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import models
from export.formats import FILE_NAMES

pytestmark = pytest.mark.slow


def _eager():
    return models.get("resnet18").build("random").module.eval()


def test_every_artifact_is_written_and_recorded(resnet18_export):
    out = resnet18_export["out"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["artifacts"]) == set(FILE_NAMES)
    for kind, record in manifest["artifacts"].items():
        path = out / record["path"]
        assert path.is_file() and path.stat().st_size == record["bytes"]
        assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert record["format"] == ("onnx" if kind.startswith("onnx") else "torchscript") and record["exporter"]
    assert manifest["weights"]["kind"] == "random" and manifest["opset"] == 18
    assert manifest["input"]["layout"] == "NCHW" and manifest["input"]["value_range"] == [0.0, 1.0]
    assert set(manifest["versions"]) >= {"python", "torch", "torchvision", "onnx", "onnxruntime"}
    assert {"trace", "script", "onnx_legacy", "onnx_dynamo", "parity"} <= set(manifest["timings_s"])
    assert manifest["parity"]["passed"] is True
    assert json.loads((out / "index_to_name.json").read_text())["0"] == "tench"
    assert not list(out.parent.glob(".artifacts.partial-*"))


@pytest.mark.parametrize("kind", list(FILE_NAMES))
@pytest.mark.parametrize("batch", [1, 3])
def test_artifact_matches_eager(resnet18_export, kind, batch):
    path = resnet18_export["out"] / FILE_NAMES[kind]
    x = torch.rand(batch, 3, 224, 224, generator=torch.Generator().manual_seed(batch))
    with torch.inference_mode():
        expected = _eager()(x)
    if path.suffix == ".pt":
        with torch.inference_mode():
            got = torch.jit.load(str(path))(x)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    else:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        got = torch.from_numpy(session.run(None, {"input": x.numpy()})[0])
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("kind", [k for k in FILE_NAMES if k.startswith("onnx")])
def test_onnx_passes_checker_with_named_dynamic_batch(resnet18_export, kind):
    path = resnet18_export["out"] / FILE_NAMES[kind]
    onnx.checker.check_model(str(path), full_check=True)
    model = onnx.load(str(path))
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert model.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert any(o.version == 18 for o in model.opset_import if o.domain in ("", "ai.onnx"))


def test_warnings_are_captured_and_reported_once(resnet18_export):
    manifest = json.loads((resnet18_export["out"] / "manifest.json").read_text())
    categories = {w["category"] for w in manifest["warnings"]}
    assert {"FutureWarning", "TracerWarning"} <= categories
    console = resnet18_export["stdout"] + resnet18_export["stderr"]
    assert "FutureWarning:" not in console and "TracerWarning:" not in console
    assert console.count("captured ") == 1


def test_resize_branch_line_and_manifest_sizes(resnet18_export):
    assert "resize branch" in resnet18_export["stdout"]
    line = next(l for l in resnet18_export["stdout"].splitlines() if "resize branch, input" in l)
    assert "traced differs from eager" in line and "scripted matches" in line
    manifest = json.loads((resnet18_export["out"] / "manifest.json").read_text())
    assert "exactly 3 x 224 x 224" in manifest["artifacts"]["traced"]["accepts"]
    assert manifest["artifacts"]["scripted"]["spatial_dynamic"] is True
    assert manifest["artifacts"]["onnx-traced"]["spatial_dynamic"] is False


def test_archive_holds_handler_runtime_artifact_manifest_labels_and_config(resnet18_export):
    import yaml
    manifest = json.loads((resnet18_export["out"] / "manifest.json").read_text())
    with zipfile.ZipFile(resnet18_export["model_store"] / "resnet.mar") as archive:
        names = set(archive.namelist())
        config = yaml.safe_load(archive.read("model-config.yaml"))
        served = config["handler"]["artifact"]
        assert served == manifest["serving"]["default_artifact"] == "onnx-dynamo"  # first of the preference order
        assert {"torchserve_entry.py", "manifest.json", "index_to_name.json", "model-config.yaml",
                "handlers/image_classifier.py", "runtime/base.py", "runtime/onnxruntime.py", "models/errors.py",
                FILE_NAMES[served]} <= names
        # the archive ships runtime/ and handlers/ (and the error root), never export/ or the rest of models/
        assert not {n for n in names if n.startswith("export/") or (n.startswith("models/") and n != "models/errors.py")}
        assert config["maxBatchDelay"] == 40  # pinned by --max-batch-delay 40 in the export command
        assert not {"batchSize", "minWorkers", "maxWorkers"} & set(config)  # decided where it is served
        # only the served artifact travels in the archive
        assert not names & {FILE_NAMES[k] for k in FILE_NAMES if k != served}


def test_manifest_records_the_serving_contract_and_no_training_mode_export(resnet18_export):
    manifest = json.loads((resnet18_export["out"] / "manifest.json").read_text())
    assert manifest["input"]["preprocessing"]["resize"] == 256  # resnet18's DEFAULT weights: 256 -> 224
    assert manifest["input"]["preprocessing"]["crop"] == [224, 224]
    assert manifest["serving"]["candidates"]["traced"].startswith("silently diverges")
    assert not [w for w in manifest["warnings"] if "training mode" in w["message"]]
    assert "onnx_dynamo" in manifest["exporter_output"]  # what the exporter printed is kept, not dropped
