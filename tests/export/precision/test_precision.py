"""`python -m export efficientnet --precision fp32,int8` (trained weights: random ones give near-tied classes
that int8 reorders, so their int8 fails the gate, as it should): the int8 artifact, how it was made, its gate, the
archive serving it, and the refusals of variants this machine cannot build (fp16 without a GPU, bf16
without native bf16). The fp16 path runs where there is a GPU."""

from __future__ import annotations

import zipfile
from pathlib import Path

import onnx
import pytest
import torch
import yaml

from contract.records import MANIFEST_NAME, Manifest
from export.errors import ExportError
from export.forms import kinds
from export.pipeline import Progress
from export.precision.onnx_int8 import RANGES_FILE
from export.precision.request import (
    PrecisionError,
    PrecisionRequest,
    check_hardware,
    cpu_has_native_bf16,
)
from export.precision.variants import VariantSources, build_variants
from export.refusals import Refusals
from runtime.machine import BF16_FLAGS, PROFILES
from tests.conftest import NO_LATENCY, run_export

INT8_FILE = kinds.get("onnx-int8").file_name


@pytest.fixture(scope="module")
def int8_export(lite0_int8_export) -> dict:
    return lite0_int8_export


@pytest.mark.slow
def test_int8_is_recorded_with_how_it_was_made_and_its_gate(int8_export):
    manifest = int8_export["manifest"]
    record = manifest.artifacts["onnx-int8"]
    assert record.path == INT8_FILE and record.format == "onnx" and record.precision == "int8"
    assert record.kind == "onnx-int8" and record.source == "onnx-traced" and record.run_precision == "fp32"
    made = record.details["made_by"]
    assert made["tool"] == "onnxruntime.quantization.quantize_static" and made["preprocessing"] == "quant_pre_process"
    assert (made["format"], made["per_channel"], made["weight_type"]) == ("QDQ", True, "QInt8")
    assert record.details["accuracy"]["passed"] and record.details["accuracy"]["images"] >= 100
    assert all(r.precision == "fp32" for k, r in manifest.artifacts.items() if k != "onnx-int8")
    assert set(manifest.fp32_artifacts()) == set(manifest.artifacts) - {"onnx-int8"}
    choice = manifest.precision["int8_choice"]
    assert set(choice["measured"]) == {"QUInt8", "QInt8"} and choice["chosen"] == made["activation_type"]
    assert all(m["images_per_s_batch1"] > 0 for m in choice["measured"].values())
    calibration, holdout = manifest.precision["calibration"], manifest.precision["holdout"]
    assert calibration["count"] == 100 and "skimage.data" in calibration["images"][0]
    assert not set(calibration["images"]) & set(holdout["images"])
    assert {RANGES_FILE, "accuracy.md", "accuracy.json"} <= set(manifest.files)
    assert "accuracy gate" in int8_export["stdout"] and "| onnx-int8 | int8 |" in int8_export["stdout"]


@pytest.mark.slow
def test_the_int8_file_is_qdq_with_per_channel_weights(int8_export):
    graph = onnx.load(str(int8_export["out"] / INT8_FILE)).graph
    ops = [node.op_type for node in graph.node]
    assert ops.count("QuantizeLinear") > 20 and ops.count("DequantizeLinear") > 40
    scales = {init.name: len(init.dims) for init in graph.initializer}
    per_channel = [node for node in graph.node if node.op_type == "DequantizeLinear"
                   and scales.get(node.input[1]) == 1 and any(a.name == "axis" for a in node.attribute)]
    assert per_channel, "no per-channel (vector-scale) weight DequantizeLinear found"


@pytest.mark.slow
def test_the_gated_int8_is_served_and_packaged(int8_export):
    serving = int8_export["manifest"].decision()
    # the OpenVINO int8 forms rank first, but no IR was built
    assert serving.served == "onnx-int8" and serving.preference[:3] == ["openvino-int8", "openvino-int8-bf16",
                                                                          "onnx-int8"]
    with zipfile.ZipFile(int8_export["archive"]) as archive:
        config = yaml.safe_load(archive.read("model-config.yaml"))
        assert "artifact" not in config["handler"]  # the archived manifest decides
        archived = Manifest.from_json(archive.read(MANIFEST_NAME).decode())
        assert archived.served_record().path == INT8_FILE and archived.served_record().precision == "int8"
        assert INT8_FILE in archive.namelist()


@pytest.mark.slow
def test_parity_recheck_verifies_every_hash_and_holds_only_fp32_artifacts_to_fp32_tolerances(int8_export, export_main):
    result = export_main("parity", int8_export["out"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "onnx-int8" not in result.stdout.split("parity passed for")[-1]


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_fp16_without_a_gpu_and_bf16_without_native_bf16_are_refused_before_any_work(profile):
    flags = PROFILES[profile].flags  # each kind of machine, whichever CPU runs the test
    with pytest.raises(PrecisionError, match="--device cuda"):
        check_hardware(("fp32", "fp16"), "cpu", flags)
    if cpu_has_native_bf16(flags):
        check_hardware(("fp32", "bf16"), "cpu", flags)
    else:
        with pytest.raises(PrecisionError, match="emulated"):
            check_hardware(("fp32", "bf16"), "cpu", flags)
    check_hardware(("fp32", "int8"), "cpu", flags)  # int8 runs anywhere
    check_hardware(("fp32", "bf16", "fp16"), "cuda", flags)
    assert cpu_has_native_bf16(flags) == (profile in ("avx512-bf16", "amx"))


def test_a_model_without_an_image_contract_cannot_be_calibrated(tmp_path):
    sources = VariantSources(tmp_path, torch.nn.Identity(), contract=None, fp32_artifacts={}, eligible=[])
    with pytest.raises(ExportError, match="input.preprocessing"):
        build_variants(sources, PrecisionRequest(("fp32", "int8")), "cpu", Progress(quiet=True),
                       Refusals(tmp_path, Progress(quiet=True)))


@pytest.mark.slow
@pytest.mark.skipif(not cpu_has_native_bf16(), reason=f"this CPU has no native bf16 ({', '.join(BF16_FLAGS)})")
def test_bf16_on_a_cpu_that_has_it(tmp_path):
    # scripted-bf16's source alone: the other fp32 forms' parity and latency were most of the export's time
    result = run_export("resnet", "--arch", "resnet18", "--weights", "random", "--out", str(tmp_path / "out"),
                        "--no-archive", "--precision", "fp32,bf16", "--formats", "scripted", *NO_LATENCY)
    assert result.returncode == 0, result.stdout + result.stderr
    record = Manifest.read(tmp_path / "out").artifacts["scripted-bf16"]
    assert record.run_precision == "bf16" and record.precision == "bf16" and record.details["accuracy"]["passed"]


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_fp16_variants_on_a_gpu(tmp_path):
    result = run_export("resnet", "--arch", "resnet18", "--weights", "random", "--out", str(tmp_path / "out"),
                        "--no-archive", "--device", "cuda", "--precision", "fp32,fp16")
    assert result.returncode == 0, result.stdout + result.stderr
    artifacts = Manifest.read(tmp_path / "out").artifacts
    assert artifacts["onnx-fp16"].precision == "fp16" and artifacts["onnx-fp16"].details["accuracy"]["passed"]
    assert artifacts["scripted-fp16"].run_precision == "fp16"
    assert artifacts["scripted-fp16"].details["accuracy"]["passed"]
    assert Path(tmp_path / "out" / kinds.get("onnx-fp16").file_name).is_file()
