"""python -m export explain on a finished export: each fp32 form agrees with eager layer by layer (a correct
export), the report is written beside it, and an unknown kind is refused with the kinds there are."""

import json

import pytest

from tests.export.user_models import USER_FILE

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def plain_export(tmp_path_factory):
    from tests.conftest import export_in_process
    out = tmp_path_factory.mktemp("plain") / "export"
    ran = export_in_process("module", f"{USER_FILE}:plain", "--input-shape", "1,3,32,32", "--out", str(out))
    assert ran.returncode == 0, ran.stderr
    return out


@pytest.mark.parametrize("kind", ["traced", "scripted", "exported", "onnx-traced", "onnx-scripted", "onnx-dynamo"])
def test_a_correct_form_agrees_module_by_module(export_main, plain_export, kind):
    ran = export_main("explain", plain_export, "--kind", kind)
    assert ran.returncode == 0, ran.stderr
    report = json.loads((plain_export / f"divergence.{kind}.json").read_text())
    assert report["first"] is None and report["compared"] >= 2, report
    assert report["output_max_abs"] <= 1e-4
    assert "agrees with eager" in ran.stdout


def test_an_unknown_kind_is_refused_with_the_kinds_there_are(export_main, plain_export):
    ran = export_main("explain", plain_export, "--kind", "onnx-int8")
    assert ran.returncode != 0 and "onnx-dynamo" in ran.stderr and "not in this export" in ran.stderr


def test_the_int8_form_is_explained_against_its_fp32_source(export_main, tmp_path):
    from tests.conftest import export_in_process
    out = tmp_path / "int8"
    made = export_in_process("module", f"{USER_FILE}:plain", "--input-shape", "1,3,32,32", "--out", str(out),
                             "--precision", "fp32,int8", "--formats", "traced,onnx-traced")
    assert made.returncode == 0, made.stderr
    ran = export_main("explain", out, "--kind", "onnx-int8")
    assert ran.returncode == 0, ran.stderr
    report = json.loads((out / "divergence.onnx-int8.json").read_text())
    modules = {row["key"] for row in report["rows"]}
    assert {"conv", "head"} <= modules  # every quantized tensor tied to the module that made it
    assert all(row["sqnr_db"] > 25 for row in report["rows"]) and report["first"] is None
