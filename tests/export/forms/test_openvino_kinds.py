"""The OpenVINO kinds through the real export command: `openvino` (the IR converted from onnx-traced's file, held
to eager by parity) and `openvino-int8` (NNCF from the calibration images, held to fp32 by the accuracy gate), each
recorded with its weights file as a companion; `openvino-int8-bf16` (the same int8 files under the bf16 hint, gated
like them) where this CPU computes in bf16; and the refusal, with the extra to install, where the openvino
package is missing (simulated in a subprocess by a None entry in sys.modules: the import itself fails)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from contract.records import MANIFEST_NAME, Manifest
from export.errors import IntegrityError
from export.forms import kinds
from export.package.manifest import verify_hashes
from export.precision.request import cpu_has_native_bf16
from runtime import RunOptions, open_artifact
from runtime.integrity import file_sha256
from runtime.machine import BF16_FLAGS
from tests.conftest import ROOT
from tests.export.user_models import PLAIN, PLAIN_SHAPE, plain_export_with_int8

pytest.importorskip("openvino")
pytest.importorskip("nncf")

MODEL, SHAPE = PLAIN, PLAIN_SHAPE
NATIVE_BF16 = cpu_has_native_bf16()
NO_NATIVE_BF16 = f"this CPU has no native bf16 ({', '.join(BF16_FLAGS)}): openvino-int8-bf16 is not made here"
INT8_KINDS = {"onnx-int8", "openvino-int8"} | ({"openvino-int8-bf16"} if NATIVE_BF16 else set())


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> dict:
    return plain_export_with_int8(tmp_path_factory.mktemp("openvino") / "plain", "openvino")


def test_every_int8_row_is_built_by_fp32_int8_where_its_source_is():
    assert [k.name for k in kinds.variants("int8")] == ["onnx-int8", "openvino-int8", "openvino-int8-bf16",
                                                        "executorch-int8"]
    assert "openvino" not in kinds.default_formats()  # opt-in: named in --formats, its variants come with it
    assert kinds.chosen_formats(["openvino"]) == ["traced", "onnx-traced", "openvino"]


def test_openvino_is_built_from_onnx_traced_and_passes_parity(export):
    manifest = export["manifest"]
    record = manifest.artifacts["openvino"]
    assert record.path == "model.openvino.xml" and record.format == "openvino" and record.precision == "fp32"
    assert record.details["converted_from"] == "model.traced.onnx"
    assert "openvino ok" in export["stdout"] and manifest.parity["passed"]


def test_the_weights_are_recorded_as_companions_and_checked(export, tmp_path):
    artifacts = export["manifest"].artifacts
    for kind, weights in (("openvino", "model.openvino.bin"), ("openvino-int8", "model.int8.openvino.bin")):
        assert artifacts[kind].companions == {weights: file_sha256(export["out"] / weights)}
    copy = tmp_path / "copy"
    shutil.copytree(export["out"], copy)
    verify_hashes(copy, export["manifest"])
    with open(copy / "model.int8.openvino.bin", "r+b") as weights:
        weights.write(b"\x00\x01\x02\x03")
    with pytest.raises(IntegrityError, match="model.int8.openvino.bin"):
        verify_hashes(copy, export["manifest"])


def test_openvino_int8_is_gated_and_says_how_it_was_made(export):
    manifest = export["manifest"]
    record = manifest.artifacts["openvino-int8"]
    assert (record.path, record.precision, record.source) == ("model.int8.openvino.xml", "int8", "openvino")
    accuracy, made = record.details["accuracy"], record.details["made_by"]
    assert accuracy["images"] >= 100 and accuracy["ran_in"] == "int8"
    assert set(manifest.precision["gate"]) == INT8_KINDS
    assert made["calibration_images"] == manifest.precision["calibration"]["count"]
    census = made["plain_quantization"]
    assert census["int8_ops"] == 2 and census["fp32_ops"] == []  # the conv and the linear head
    backend = open_artifact("openvino", export["out"] / record.path, RunOptions(threads=1))
    assert backend.describe()["actual_precision"] == "fp32"  # the hint; the quantized ops compute in int8


@pytest.mark.skipif(not NATIVE_BF16, reason=NO_NATIVE_BF16)
def test_openvino_int8_bf16_runs_the_int8_files_with_the_remainder_in_bf16(export):
    manifest = export["manifest"]
    record, int8 = manifest.artifacts["openvino-int8-bf16"], manifest.artifacts["openvino-int8"]
    assert (record.path, record.sha256, record.companions) == (int8.path, int8.sha256, int8.companions)  # no new file
    assert (record.format, record.precision, record.run_precision, record.source) == ("openvino", "int8", "bf16",
                                                                                      "openvino")
    made, accuracy = record.details["made_by"], record.details["accuracy"]
    assert made["file_of"] == "openvino-int8" and made["file_made_by"] == int8.details["made_by"]["tool"]
    assert made["remainder_ran_in"] == "bf16"  # read back from OpenVINO, not assumed
    assert accuracy["precision"] == "int8" and accuracy["images"] == int8.details["accuracy"]["images"]  # int8's gate
    backend = open_artifact("openvino", export["out"] / record.path, RunOptions(threads=1, precision="bf16"))
    assert backend.describe()["actual_precision"] == "bf16"


@pytest.mark.skipif(NATIVE_BF16, reason="this CPU computes in bf16: openvino-int8-bf16 is made here")
def test_without_native_bf16_int8_makes_what_it_made_before_and_says_why_not_the_bf16_remainder(export):
    manifest = export["manifest"]
    assert "openvino-int8-bf16" not in manifest.artifacts and "openvino-int8-bf16" not in manifest.refused
    assert "openvino-int8-bf16 not made: it runs its int8 file's remainder in bf16, not fast on this CPU" in \
        export["stdout"]


def test_without_the_openvino_package_its_kinds_are_refused_and_the_others_go_on(tmp_path):
    out = tmp_path / "no-openvino"
    script = ("import sys; sys.modules['openvino'] = None; from export.cli import main; "
              f"sys.exit(main(['module', {MODEL!r}, '--input-shape', {SHAPE!r}, '--formats', 'onnx-dynamo,openvino', "
              f"'--out', {str(out)!r}]))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = Manifest.from_json((out / MANIFEST_NAME).read_text())
    assert "onnx-dynamo" in manifest.artifacts and "openvino" not in manifest.artifacts
    assert "pip install '.[openvino]'" in manifest.refused["openvino"].message
