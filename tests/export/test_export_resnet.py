"""`python -m export resnet` on resnet18 with random weights: every artifact, checked by loading it."""

import dataclasses
import hashlib
import zipfile

import onnx
import onnxruntime as ort
import pytest
import torch

import models
from contract.handler_config import HandlerConfig, read_labels
from contract.records import FORM_TIMING_NAME, MANIFEST_NAME, SCHEMA_VERSION, Manifest
from export.forms import kinds
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

FILE_NAMES = {k: kinds.get(k).file_name for k in kinds.default_formats()}


def _eager():
    return models.get("resnet18").build("random").module.eval()


def _archived(archive: zipfile.ZipFile) -> Manifest:
    return Manifest.from_json(archive.read(MANIFEST_NAME).decode(), "resnet18.mar manifest.json")


def test_every_artifact_is_written_and_recorded(resnet18_export):
    out = resnet18_export["out"]
    manifest = Manifest.read(out)
    assert manifest.schema == SCHEMA_VERSION and manifest.model.name == "resnet18"
    assert manifest.model.source == {"registry": "resnet18"}
    assert set(manifest.artifacts) == set(FILE_NAMES) and manifest.refused == {}
    for kind, record in manifest.artifacts.items():
        path = out / record.path
        assert record.kind == kind and record.path == FILE_NAMES[kind]
        assert path.is_file() and path.stat().st_size == record.bytes
        assert record.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
        expected_format = "onnx" if kind.startswith("onnx") else "torch-export" if kind == "exported" else "torchscript"
        assert record.format == kinds.get(kind).format == expected_format
        assert record.exporter == kinds.get(kind).exporter and record.precision == "fp32"
    for name, record in manifest.files.items():
        assert record.sha256 == hashlib.sha256((out / name).read_bytes()).hexdigest()
    assert {"index_to_name.json", "parity.md", "parity.json", "report.md", "report.json"} <= set(manifest.files)
    assert manifest.weights["kind"] == "random" and manifest.opset == 18
    assert manifest.input.layout == "NCHW" and manifest.input.value_range == (0.0, 1.0)
    assert manifest.input.example_shape == (1, 3, 224, 224) and manifest.input.resizes_in_graph
    assert manifest.output.shape == ["batch", 1000] and manifest.output.classes == 1000
    assert set(manifest.versions) >= {"python", "torch", "torchvision", "onnx", "onnxruntime"}
    assert set(FILE_NAMES) | {"build", "eval_check", "inspect", "parity", "trace_vs_script"} <= set(manifest.timings_s)
    assert manifest.parity["passed"] is True
    assert read_labels(out / manifest.output.labels)[0] == "tench"
    assert not list(out.parent.glob(".artifacts.partial-*"))


def test_progress_names_each_kind_its_exporter_and_file(resnet18_export):
    lines = resnet18_export["stdout"].splitlines()
    for kind in map(kinds.get, kinds.default_formats()):
        shown = f"] {kind.name}: {kind.exporter} -> {kind.file_name} ("
        assert any(shown in line and line.endswith(" s)") for line in lines), kind.name  # with its duration


@pytest.mark.parametrize("kind", list(FILE_NAMES))
@pytest.mark.parametrize("batch", [1, 3])
def test_artifact_matches_eager(resnet18_export, kind, batch):
    path = resnet18_export["out"] / FILE_NAMES[kind]
    x = torch.rand(batch, 3, 224, 224, generator=torch.Generator().manual_seed(batch))
    with torch.inference_mode():
        expected = _eager()(x)
    if path.suffix in (".pt", ".pt2"):  # each through its own library, not runtime/
        with torch.inference_mode():
            got = (torch.jit.load(str(path)) if path.suffix == ".pt" else torch.export.load(str(path)).module())(x)
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
    manifest = Manifest.read(resnet18_export["out"])
    categories = {w["category"] for w in manifest.warnings}
    assert {"FutureWarning", "TracerWarning"} <= categories
    console = resnet18_export["stdout"] + resnet18_export["stderr"]
    assert "FutureWarning:" not in console and "TracerWarning:" not in console
    assert console.count("captured ") == 1


def test_resize_branch_line_and_manifest_sizes(resnet18_export):
    assert "resize branch" in resnet18_export["stdout"]
    line = next(row for row in resnet18_export["stdout"].splitlines() if "resize branch, input" in row)
    assert "traced differs from eager" in line and "scripted matches" in line
    artifacts = Manifest.read(resnet18_export["out"]).artifacts
    assert "exactly 3 x 224 x 224" in artifacts["traced"].accepts
    assert artifacts["scripted"].spatial_dynamic is True
    assert artifacts["onnx-traced"].spatial_dynamic is False
    assert artifacts["traced"].spatial_dynamic is False  # the traced graph keeps the example's size


def test_archive_holds_handler_runtime_contract_artifact_manifest_labels_and_config(resnet18_export):
    import yaml
    manifest = Manifest.read(resnet18_export["out"])
    assert resnet18_export["archive"] == resnet18_export["model_store"] / "resnet18.mar"  # named after the model
    assert sorted(p.name for p in resnet18_export["model_store"].iterdir()) == ["resnet18.mar", "resnet18.v1.mar"]
    with zipfile.ZipFile(resnet18_export["archive"]) as archive:
        names = set(archive.namelist())
        config = yaml.safe_load(archive.read("model-config.yaml"))
        archived = _archived(archive)
        served = archived.served_record()
        # the export's manifest plus the version the store gave it; its declared choice is the export's
        assert dataclasses.replace(archived, model_version=None) == manifest and archived.model_version.number == 1
        assert served.kind == manifest.decision().served == "onnx-dynamo"
        assert {"torchserve_entry.py", MANIFEST_NAME, "index_to_name.json", "model-config.yaml",
                "handlers/image_classifier.py", "runtime/base.py", "runtime/onnxruntime.py", "contract/errors.py",
                "contract/records.py", served.path} <= names
        assert hashlib.sha256(archive.read(served.path)).hexdigest() == served.sha256
        if FORM_TIMING_NAME in manifest.files:  # the export's timing of the candidates this machine meets (2 or more)
            assert archive.read(FORM_TIMING_NAME) == (resnet18_export["out"] / FORM_TIMING_NAME).read_bytes()
        # the archive ships contract/, runtime/ and handlers/ whole (what development imports), nothing else of ours
        assert not {n for n in names if n.split("/")[0] in ("models", "export", "serving", "measure")}
        assert {n for n in names if n.startswith("contract/")} == {
            f"contract/{p.name}" for p in (ROOT / "contract").glob("*.py")}
        assert config["maxBatchDelay"] == 40  # pinned by --max-batch-delay 40 in the export command
        assert not {"batchSize", "minWorkers", "maxWorkers"} & set(config)  # decided where it is served
        assert set(config["handler"]) <= set(HandlerConfig.keys()) and "artifact" not in config["handler"]
        # only the served artifact travels in the archive
        assert not names & {FILE_NAMES[k] for k in FILE_NAMES if k != served.kind}


def test_manifest_records_the_serving_contract_and_no_training_mode_export(resnet18_export):
    manifest = Manifest.read(resnet18_export["out"])
    contract = manifest.input.image_contract()
    assert contract.resize == 256  # resnet18's DEFAULT weights: 256 -> 224
    assert contract.crop == (224, 224) and manifest.input.handler_input() == (3, 224, 224)
    decision = manifest.decision()
    assert decision.candidates["traced"] == "silently diverges from eager on: 320x320 (resize branch)"
    assert decision.preference == list(kinds.serving_preference()) and decision.requested is None
    assert "traced" not in decision.servable and not decision.speed_only
    assert not [w for w in manifest.warnings if "training mode" in w["message"]]
    assert "onnx-dynamo" in manifest.exporter_output  # what the exporter printed is kept, not dropped
