"""python -m export explain on a detector: the real MTCNN export (its trained weights; traced and scripted only, a
few seconds), whose traced form the export refuses. Explain makes it again and names what a trace freezing the
image pyramid looks like: the set of boxes differs from eager's and the first module whose output shape differs
is PNet's first convolution. The scripted form agrees as a set and layer by layer; a form the export could not
make at all, and a photo that is not one, are refused in one line."""

import json

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow
GRID = "lfw_subset's first 25 faces in a 5 x 5 grid (many faces)"  # the probe a trace answers wrong without error


@pytest.fixture(scope="module")
def faces(mtcnn_faces_export):
    return mtcnn_faces_export["out"]  # tests/export/conftest.py: traced and scripted only


def test_the_refused_trace_is_made_again_and_its_frozen_pyramid_named(export_main, faces):
    manifest = json.loads((faces / "manifest.json").read_text())
    assert "traced" in manifest["refused"] and "traced" not in manifest["artifacts"]
    ran = export_main("explain", faces, "--kind", "traced")
    assert ran.returncode == 0, ran.stderr
    report = json.loads((faces / "divergence.traced.json").read_text())
    assert GRID in report["inputs"]  # the inputs it cannot run are passed over, and listed
    assert any("does not run" in note and "'random'" in note for note in report["notes"])
    verdict = report["set"]
    assert not verdict["passed"] and verdict["reference_count"] == 25 and verdict["candidate_count"] > 25
    first = report["first"]
    assert first["module"] == "pnet.conv1" and first["note"].startswith("shape ")
    assert "control flow differs" in verdict["diagnosis"] and "pnet.conv1" in ran.stdout
    assert "refused by the export" in report["notes"][0]


def test_the_scripted_form_agrees_as_a_set_and_layer_by_layer(export_main, faces):
    ran = export_main("explain", faces, "--kind", "scripted", "--image", ROOT / "examples" / "cat.jpg")
    assert ran.returncode == 0, ran.stderr
    report = json.loads((faces / "divergence.scripted.json").read_text())
    assert report["inputs"].startswith("'cat.jpg'") and report["first"] is None and report["compared"] > 10
    assert report["set"]["passed"] and "the set agrees" in report["summary"]


def test_a_form_never_made_and_a_file_that_is_no_photo_are_refused_in_one_line(export_main, faces, tmp_path):
    ran = export_main("explain", faces, "--kind", "onnx-traced")
    assert ran.returncode != 0 and "not in this export" in ran.stderr and "Traceback" not in ran.stderr
    text = tmp_path / "notes.jpg"
    text.write_text("not a photo")
    ran = export_main("explain", faces, "--kind", "scripted", "--image", text)
    assert ran.returncode != 0 and "cannot be read as an image" in ran.stderr and "Traceback" not in ran.stderr
