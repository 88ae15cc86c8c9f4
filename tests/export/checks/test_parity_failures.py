"""Parity must fail loudly: a perturbed ONNX weight, a modified file, and `python -m export parity DIR`.

A re-check that rebuilds the random weights runs as its own process, as a user runs it: the drawn weights are
the same in a process like the exporting one (this test process may have changed torch's thread count, which
moves the drawn normalisation statistics by rounding). One that fails before rebuilding runs in this process."""

import json
import shutil

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import models
from contract.records import MANIFEST_NAME, SCHEMA_VERSION, Manifest
from export.checks.parity import UnderTest, parity_inputs, run_parity
from export.errors import ParityError
from export.forms import kinds
from runtime import file_sha256, open_artifact
from runtime.eager import EagerBackend
from tests.conftest import run_export

pytestmark = pytest.mark.slow


@pytest.fixture
def export_copy(resnet18_export, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(resnet18_export["out"], copy)
    return copy


def test_parity_passes_on_every_artifact(resnet18_export):
    summary = json.loads((resnet18_export["out"] / "parity.json").read_text())["summary"]
    assert set(summary) == set(kinds.default_formats())
    assert all(s["passed"] and s["top1_agreement"] == 1.0 for s in summary.values())
    # each kind was held to its own tolerance from the kinds table
    assert all(s["tolerance"] == {"atol": kinds.get(k).tolerance.atol, "rtol": kinds.get(k).tolerance.rtol}
               for k, s in summary.items())
    assert (resnet18_export["out"] / "parity.md").read_text().count("| pass |") >= 5


def test_perturbed_onnx_weight_fails_with_typed_error_and_numbers(export_copy):
    model = onnx.load(str(export_copy / "model.traced.onnx"))
    weight = next(t for t in model.graph.initializer if len(t.dims) == 4 and np.prod(t.dims) > 1000)
    values = numpy_helper.to_array(weight).copy()
    values.flat[0] += 0.5  # one weight of one convolution
    weight.CopyFrom(numpy_helper.from_array(values, weight.name))
    perturbed = export_copy / "perturbed.onnx"
    onnx.save(model, str(perturbed))

    module = models.get("resnet18").build("random").module.eval()
    candidate = UnderTest(open_artifact("onnx", perturbed), kinds.get("onnx-traced").tolerance, False)
    report = run_parity(EagerBackend(module), {"perturbed": candidate}, parity_inputs((1, 3, 224, 224)))
    with pytest.raises(ParityError) as error:
        report.raise_on_failure()
    numbers = error.value.failures[0].metrics
    assert numbers["max_abs"] > 1e-3 and numbers["required_rtol"] > 1e-3
    assert "perturbed" in str(error.value) and "max_abs=" in str(error.value)


def test_recheck_passes_on_a_clean_folder(export_copy):
    result = run_export("parity", str(export_copy))
    assert result.returncode == 0, result.stderr
    assert "sha256 of" in result.stdout and "parity passed" in result.stdout
    assert (export_copy / "parity.recheck.json").is_file()


def test_recheck_names_a_modified_artifact(export_copy, export_main):
    with open(export_copy / "model.scripted.onnx", "r+b") as handle:
        handle.seek(-10, 2)
        handle.write(b"0123456789")
    result = export_main("parity", export_copy)
    assert result.returncode == 4  # contract.errors.EXIT_INTEGRITY
    recorded = Manifest.read(export_copy).artifacts["onnx-scripted"].sha256
    assert f"model.scripted.onnx: sha256 {file_sha256(export_copy / 'model.scripted.onnx')} but the manifest " \
           f"records {recorded}" in result.stderr
    assert "Traceback" not in result.stderr


def test_recheck_fails_loudly_when_an_artifact_disagrees(export_copy):
    """A file re-exported with different weights but a matching hash entry: parity itself must catch it."""
    import hashlib
    manifest = Manifest.read(export_copy)
    model = onnx.load(str(export_copy / "model.dynamo.onnx"))
    weight = next(t for t in model.graph.initializer if len(t.dims) == 4)
    values = numpy_helper.to_array(weight).copy() * 1.5
    weight.CopyFrom(numpy_helper.from_array(values, weight.name))
    onnx.save(model, str(export_copy / "model.dynamo.onnx"))
    record = manifest.artifacts["onnx-dynamo"]
    data = (export_copy / "model.dynamo.onnx").read_bytes()
    record.sha256, record.bytes = hashlib.sha256(data).hexdigest(), len(data)
    (export_copy / MANIFEST_NAME).write_text(manifest.to_json())
    result = run_export("parity", str(export_copy))
    assert result.returncode == 3
    assert "parity failed for onnx-dynamo" in result.stderr and "| onnx-dynamo |" in result.stderr


def test_recheck_refuses_a_manifest_of_another_schema_version(export_copy, export_main):
    data = Manifest.read(export_copy).to_dict()
    data["schema"] = 1
    (export_copy / MANIFEST_NAME).write_text(json.dumps(data))
    result = export_main("parity", export_copy)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"manifest schema version 1, but this code reads version {SCHEMA_VERSION}" in result.stderr
    assert "re-run the export" in result.stderr
