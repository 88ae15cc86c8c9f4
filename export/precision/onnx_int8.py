"""onnx-int8: ONNX Runtime static quantization of an fp32 ONNX artifact, gated (a builder of
export.precision.builder).

quant_pre_process first, then quantize_static with QDQ nodes, per-channel QInt8 weights (7-bit where the CPUs it
must run on would saturate: weight_bits), MinMax ranges calibrated once on the calibration images (cached in
int8.ranges.json and reused). Activations are QUInt8 or QInt8, chosen on this machine by measurement: both are
built, timed and gated, and the fastest that passes the gate is kept (ORT documents S8S8 as its default; U8S8 is
the one whose kernels use u8 x s8 dot products on x86). Both numbers and the choice are recorded. When neither
passes, export.precision.int8_fallback puts the most damaging nodes back in fp32, one at a time, until the
calibration images meet a stricter target than the gate or its limit is reached, then gates the result on the
held-out images (recorded in made_by.fp32_fallback).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from contract.records import INPUT_NAME
from export.precision import int8_fallback
from export.precision.builder import Variant, VariantContext
from export.precision.calibration import ImageSet, TensorReader
from export.precision.gate import GateResult
from export.precision.held_out import HeldOut, run_batches
from runtime import RunOptions, machine, open_artifact

RANGES_FILE = "int8.ranges.json"  # calibrated tensor ranges: the int8 model can be rebuilt from them
ACTIVATION_TYPES = ("QUInt8", "QInt8")  # weights are QInt8 either way (symmetric, per channel)

SATURATES = ("ONNX Runtime's u8 x s8 kernels without VNNI add products in int16, which saturates (ONNX Runtime's "
             "quantization guide)")


def weight_bits(target_flags: frozenset | None = None) -> tuple[bool, str]:
    """(reduce_range, why): 7-bit weights where this CPU or the --target machine lacks VNNI on x86, so that the
    int8 file is exact on both; 8-bit weights only where neither saturates."""
    if machine.int8_saturates(machine.cpu_flags()):
        return True, f"7-bit weights: this CPU has no VNNI, and {SATURATES}"
    if target_flags is not None and machine.int8_saturates(set(target_flags)):
        return True, f"7-bit weights: the --target machine has no VNNI, and {SATURATES}"
    return False, "8-bit weights: this CPU's int8 kernels do not saturate (VNNI, or not x86)" + (
        ", nor the --target machine's" if target_flags is not None else "")


@dataclass
class Int8Work:
    """Where int8 is made: a scratch folder, the source prepared for quantization (quant_pre_process), the
    calibrated ranges (cached: every quantization after the first reuses them) and the calibration images."""

    folder: Path
    prepared: Path
    ranges: Path
    calibration: ImageSet
    # 7-bit weights where this CPU's or the target's int8 kernels would saturate (weight_bits)
    bits: tuple[bool, str] = field(default_factory=weight_bits)

    @property
    def reduce_range(self) -> bool:
        return self.bits[0]

    def quantize(self, path: Path, activation: str, extra_options: dict | None = None) -> None:
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
        quantize_static(str(self.prepared), str(path), TensorReader(self.calibration.images, INPUT_NAME),
                        quant_format=QuantFormat.QDQ, per_channel=True, activation_type=getattr(QuantType, activation),
                        weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax,
                        reduce_range=self.reduce_range, calibration_cache_path=self.ranges,
                        extra_options=extra_options)


def build_int8(context: VariantContext, kind, source) -> Variant:
    """Quantize `source` with both activation types; keep the fastest that passes the gate."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    stage, held_out = context.stage, context.held_out
    work = Int8Work(stage / ".int8-work", stage / ".int8-work" / "prepared.onnx", stage / RANGES_FILE,
                    context.calibration, weight_bits(context.target_flags))
    work.folder.mkdir(exist_ok=True)
    try:
        started = time.perf_counter()
        quant_pre_process(str(source.path), str(work.prepared))
        candidates, timings = {}, {"preprocess_s": round(time.perf_counter() - started, 2)}
        for activation in ACTIVATION_TYPES:
            started = time.perf_counter()
            path = work.folder / f"int8-{activation}.onnx"
            work.quantize(path, activation)
            timings[f"quantize_{activation}_s"] = round(time.perf_counter() - started, 2)
            backend = open_artifact(kind.format, path, RunOptions(), name=f"int8 {activation}")
            speed, gate = held_out.speed(backend), held_out.gate(kind, backend)
            candidates[activation] = (path, speed, gate)
            context.progress.step(f"int8 activations {activation}, weights QInt8: {speed:.1f} images/s at batch 1, "
                                  f"gate {gate.verdict} (top-1 agreement {100 * gate.metrics['top1_agreement']:.1f}%)")
        chosen, why = choose_activation_type({a: (s, g.passed) for a, (_, s, g) in candidates.items()})
        path, speed, gate = candidates[chosen]
        fallback = None
        if not gate.passed and held_out.can_judge:  # put the most damaging nodes back in fp32 (int8_fallback)
            path, speed, gate, fallback = _fall_back(work, kind, source, chosen, held_out, context.progress)
        elif not gate.passed:
            fallback = {"skipped": held_out.cannot_judge_note()}
        shutil.move(str(path), str(stage / kind.file_name))
    finally:
        shutil.rmtree(work.folder, ignore_errors=True)
    made_by = {"tool": "onnxruntime.quantization.quantize_static", "preprocessing": "quant_pre_process",
               "format": "QDQ", "per_channel": True, "weight_type": "QInt8", "activation_type": chosen,
               "reduce_range": work.reduce_range, "reduce_range_why": work.bits[1],
               "calibrate_method": "MinMax", "calibration_images": len(work.calibration), "ranges": RANGES_FILE,
               "timings": timings, "fp32_fallback": fallback}
    choice = {"chosen": chosen, "why": why,
              "measured": {a: {"images_per_s_batch1": round(s, 1), "gate": g.verdict,
                               "top1_agreement": g.metrics["top1_agreement"]} for a, (_, s, g) in candidates.items()},
              "fp32_fallback": _fallback_choice(fallback, speed, gate)}
    return Variant(kind=kind.name, path=stage / kind.file_name, format=kind.format, precision=kind.precision,
                   run_precision=kind.run_precision, source=source.kind, made_by=made_by, gate=gate, images_per_s=speed,
                   files=(RANGES_FILE,), choice=choice)


def _fallback_choice(fallback: dict | None, speed: float, gate) -> dict | None:
    """The fp32 fallback as the manifest's int8 choice records it: its nodes, speed and gate, or why it was skipped."""
    if not fallback or "fp32_nodes" not in fallback:
        return fallback
    return {"nodes": [f"{r['node']} ({r['kind']})" for r in fallback["fp32_nodes"]],
            "images_per_s_batch1": round(speed, 1), "gate": gate.verdict}


def _fall_back(work: Int8Work, kind, source, activation: str, held_out: HeldOut,
               progress) -> tuple[Path, float, GateResult, dict]:
    """Re-quantize (cached ranges) with activations kept explicit, put nodes back in fp32 until the calibration
    images meet the selection target (int8_fallback.SELECTION_SHARE of the gate's tolerance), then gate the
    result on the held-out images once."""
    import onnx

    explicit = work.folder / f"int8-{activation}-explicit.onnx"
    work.quantize(explicit, activation, int8_fallback.QUANTIZE_OPTIONS)
    fp32 = open_artifact(source.format, source.path, RunOptions(), name="fp32 source")
    timing = work.folder / "timing.onnx"

    def speed(model) -> float:
        int8_fallback.save(model, timing)
        return held_out.speed(open_artifact(kind.format, timing, RunOptions(), name="int8 step"))

    images = work.calibration.images
    graphs = int8_fallback.FallbackInputs(onnx.load(str(explicit)), onnx.load(str(work.prepared)), images,
                                          run_batches(fp32, images))
    model, fallback = int8_fallback.fall_back(graphs, kind, speed, progress)
    path = work.folder / "int8-fallback.onnx"
    int8_fallback.save(model, path)
    backend = open_artifact(kind.format, path, RunOptions(), name="int8 with fp32 fallback")
    gate = held_out.gate(kind, backend)
    progress.step(f"int8 with {len(fallback.fp32_nodes)} fp32 node(s): held-out gate {gate.verdict}")
    return path, held_out.speed(backend), gate, fallback.record()


def choose_activation_type(measured: dict[str, tuple[float, bool]]) -> tuple[str, str]:
    """measured: activation type -> (batch-1 images/s, passed the gate). The fastest that passed; when none
    passed, the fastest (the gate then fails the export with its numbers)."""
    passing = {a: speed for a, (speed, passed) in measured.items() if passed}
    pool = passing or {a: speed for a, (speed, _) in measured.items()}
    chosen = max(pool, key=pool.get)
    others = ", ".join(f"{a} {s:.1f}" for a, (s, _) in measured.items() if a != chosen)
    if passing:
        why = f"fastest that passed the accuracy gate here: {chosen} {pool[chosen]:.1f} images/s vs {others}"
    else:
        why = f"none passed the accuracy gate; {chosen} is the fastest ({pool[chosen]:.1f} images/s vs {others})"
    return chosen, why
