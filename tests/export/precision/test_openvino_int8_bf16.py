"""openvino-int8-bf16: the openvino-int8 IR run under OpenVINO's bf16 hint (its layers left in floating point run in
bf16), made by --precision int8 only where this CPU, which gates it, and the target both compute in bf16. What is
built is checked on simulated CPUs (runtime.machine.PROFILES), whichever CPU runs the test; the export through real
OpenVINO is tests/export/forms/test_openvino_kinds.py's."""

from __future__ import annotations

from pathlib import Path

import pytest

from export.forms import kinds
from export.precision.builder import Variant, VariantContext
from export.precision.gate import INT8_TOLERANCE, AccuracyGateError, GateResult
from export.precision.half import run_in_precision
from export.precision.request import PrecisionError, PrecisionRequest, check_hardware, target_precisions
from export.precision.variants import PrecisionReport
from runtime.machine import BF16_FLAGS, CPU, PROFILES, Needs

KIND = "openvino-int8-bf16"
CPU_PROFILES = [name for name, profile in PROFILES.items() if profile.device == CPU]
NATIVE_BF16 = ("avx512-bf16", "amx")


def test_the_row_runs_openvino_int8s_files_with_its_remainder_in_bf16():
    row, int8 = kinds.get(KIND), kinds.get("openvino-int8")
    assert (row.file_name, row.companions, row.format) == (int8.file_name, int8.companions, int8.format)
    assert (row.precision, row.run_precision, row.needs, row.sources) == ("int8", "bf16", (int8.name,), int8.sources)
    assert row.runs_on == Needs(CPU) and row.fast_on == Needs(CPU, (BF16_FLAGS,)) and row.fast_why
    assert row.runs_beyond_its_precision and not int8.runs_beyond_its_precision
    assert [kinds.get(k).run_precision for k in ("openvino-int8", "onnx-int8", "openvino-bf16", "scripted-bf16")] == [
        "fp32", "fp32", "bf16", "bf16"]
    order = kinds.serving_preference()
    assert order.index("openvino-int8") < order.index(KIND) < order.index("openvino-bf16") and row.rank_reason


@pytest.mark.parametrize("profile", CPU_PROFILES)
def test_int8_makes_it_only_on_a_cpu_that_computes_in_bf16(profile):
    flags = PROFILES[profile].flags
    request = PrecisionRequest(("fp32", "int8"))
    check_hardware(request.precisions, "cpu", flags)  # int8 itself is asked for anywhere, as before
    # executorch-int8 is asked for everywhere; it is made where its source is (executorch named in --formats)
    if profile in NATIVE_BF16:
        assert request.kinds_to_build(flags) == ["onnx-int8", "openvino-int8", KIND, "executorch-int8"]
        assert request.left_out(flags) == {}
    else:  # --precision fp32,int8 builds what it built before this kind
        assert request.kinds_to_build(flags) == ["onnx-int8", "openvino-int8", "executorch-int8"]
        assert request.left_out(flags)[KIND] == ("it runs its int8 file's remainder in bf16, not fast on this CPU "
                                                 "(needs avx512_bf16 or amx_bf16, which this CPU lacks)")


@pytest.mark.parametrize("target", CPU_PROFILES)
def test_the_target_must_be_fast_with_it_too(target):
    """--target decides where it serves: a bf16 export machine leaves it out for a target without bf16."""
    request = PrecisionRequest(("fp32", "int8"), target_flags=PROFILES[target].flags)
    left_out = request.left_out(PROFILES["amx"].flags)
    assert (KIND in left_out) == (target not in NATIVE_BF16)
    assert "the --target machine" in left_out.get(KIND, "the --target machine")


@pytest.mark.parametrize("target", CPU_PROFILES)
def test_precision_target_names_the_same_precisions_as_before(target):
    """It is an int8 kind: --precision target/auto gains no precision for it, on any target."""
    chosen, _ = target_precisions(PROFILES[target], "cpu", PROFILES["amx"].flags)
    assert chosen == (("fp32", "int8", "bf16") if target in NATIVE_BF16 else ("fp32", "int8"))


def test_it_is_refused_when_the_int8_ir_it_runs_was_not_made(tmp_path):
    context = VariantContext(tmp_path, "cpu", None, held_out=None, progress=None)
    with pytest.raises(PrecisionError, match="runs the openvino-int8 file, which was not made"):
        run_in_precision(context, kinds.get(KIND), source=None)


def test_its_failed_gate_sets_it_aside_and_never_fails_an_enforced_export():
    """--precision int8 names int8: openvino-int8 failing its gate fails the export (enforce), the tool's bf16
    remainder of the same file failing is kept out of the candidates and the export goes on."""
    def failed(kind: str) -> Variant:
        metrics = {"top1_agreement": 0.71, "top5_agreement": 1.0, "mean_logit_error": 0.1, "relative_logit_error": 0.1,
                   "max_logit_error": 1.0, "confident_images": 51, "top1_agreement_confident": 0.961}
        gate = GateResult(kind, "int8", 128, INT8_TOLERANCE, metrics, ["top-1 agreement 96.1% < 98.0%"])
        return Variant(kind, Path(f"{kind}.xml"), "openvino", "int8", "fp32", "openvino", {}, gate)
    extra_only = PrecisionReport({KIND: failed(KIND)})
    assert [g.kind for g in extra_only.set_aside] == [KIND]
    extra_only.raise_on_failure()  # nothing raised
    both = PrecisionReport({"openvino-int8": failed("openvino-int8"), KIND: failed(KIND)})
    with pytest.raises(AccuracyGateError) as raised:
        both.raise_on_failure()
    assert [g.kind for g in raised.value.results] == ["openvino-int8"]
