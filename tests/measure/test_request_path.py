"""`python -m measure pipeline`: handlers.core's own decode -> preprocess -> inference -> encode timed per body
beside the model alone, written as pipeline.md/json; a body the handler refuses is named, not timed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from PIL import Image

from measure.request_path import stages
from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # needs the resnet18 export


def _png(path, size=(1200, 900)):
    Image.radial_gradient("L").convert("RGB").resize(size).save(path, "PNG")


def test_each_body_gets_its_stages_and_the_model_alone_beside_them(resnet18_export, tmp_path):
    images = tmp_path / "bodies"
    images.mkdir()
    (images / "cat.jpg").write_bytes((ROOT / "examples" / "cat.jpg").read_bytes())
    _png(images / "gradient.png")
    (images / "notes.txt").write_text("not an image: skipped by suffix")
    out = tmp_path / "out"
    assert stages.main(["--export-dir", str(resnet18_export["out"]), "--images", str(images),
                          "--seconds", "0.1", "--out", str(out)]) == 0
    report = json.loads((out / "pipeline.json").read_text())
    # the resnet18 export's decode check passed: each body is measured exact and draft (before and after)
    assert resnet18_export_decode(resnet18_export) == "draft"
    rows = {(row["body"], row["decode"].split()[0]): row for row in report["rows"]}
    assert set(rows) == {(body, mode) for body in ("cat.jpg", "gradient.png") for mode in ("exact", "draft")}
    assert rows["gradient.png", "draft"]["shown"] == [1200, 900]  # the photo's size, not the decoded one
    for row in rows.values():
        assert set(row["stage_ms"]) == {"decode", "preprocess", "inference", "encode"}
        assert all(v >= 0 for v in row["stage_ms"].values()) and row["runs"] >= stages.MIN_RUNS
        # the ratio is of the two times the row reports (no bound on the times: 0.1 s of timing on a shared CPU)
        ratio = row["model_ms_per_image"] / row["pipeline_ms_per_image"]
        assert row["pipeline_vs_model"] > 0 and abs(row["pipeline_vs_model"] - ratio) <= 0.01 + 0.01 * ratio
    assert report["context"]["model"] == "resnet18"
    assert "| gradient.png | 1200x900 |" in (out / "pipeline.md").read_text()


def resnet18_export_decode(export: dict) -> str:
    from contract.records import Manifest
    return Manifest.read(export["out"]).input.preprocessing.decode


def test_a_body_the_handler_refuses_is_named_with_its_reason(resnet18_export, tmp_path):
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff" + b"\x00" * 50)
    result = subprocess.run([sys.executable, "-m", "measure", "pipeline", "--export-dir", str(resnet18_export["out"]),
                             "--images", str(bad), "--seconds", "0.1", "--out", str(tmp_path / "out")],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode != 0 and "broken.jpg is refused by the handler" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(stages.MeasureError, match="no image file there"):
        stages.bodies(empty)


def test_any_form_of_the_export_is_measured_with_artifact_and_an_unknown_one_is_named(resnet18_export, tmp_path):
    out = tmp_path / "out"
    assert stages.main(["--export-dir", str(resnet18_export["out"]), "--images", str(ROOT / "examples" / "cat.jpg"),
                        "--artifact", "traced", "--decode", "exact", "--seconds", "0.1", "--out", str(out)]) == 0
    assert json.loads((out / "pipeline.json").read_text())["context"]["artifact"] == "traced"
    result = subprocess.run([sys.executable, "-m", "measure", "pipeline", "--export-dir", str(resnet18_export["out"]),
                             "--artifact", "nope", "--out", str(tmp_path / "x")],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode != 0 and "--artifact nope: this export has " in result.stderr, result.stderr
    assert "traced" in result.stderr.split("this export has ")[1] and "Traceback" not in result.stderr
