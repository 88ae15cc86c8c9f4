"""Reduced-precision variants of an export, each gated on accuracy before it may be served.

  onnx-int8      ONNX Runtime static quantization of an fp32 ONNX artifact: quant_pre_process first, then
                 quantize_static with QDQ nodes, per-channel QInt8 weights, MinMax ranges calibrated once on
                 the calibration images (cached in int8.ranges.json and reused). Activations are QUInt8 or
                 QInt8, chosen on this machine by measurement: both are built, timed and gated, and the
                 fastest that passes the gate is kept (ORT documents S8S8 as its default; U8S8 is the one
                 whose kernels use u8 x s8 dot products on x86). Both numbers and the choice are recorded.
                 When neither passes, export.precision.int8_fallback puts the most damaging nodes back in fp32, one at a
                 time, until the calibration images meet a stricter target than the gate or its limit is
                 reached, then gates the result on the held-out images (recorded in made_by.fp32_fallback).
  scripted-bf16  the scripted TorchScript artifact run under torch.autocast(bfloat16) (PyTorch's CPU autocast;
                 fast only on CPUs with native bf16: AVX512-BF16 or AMX).
  onnx-fp16      the fp32 ONNX converted to float16 (inputs and outputs stay float32) for ONNX Runtime's CUDA
                 provider, and
  scripted-fp16  the scripted TorchScript artifact under CUDA fp16 autocast: both need --device cuda.
  openvino-int8  NNCF post-training quantization of the OpenVINO IR (export.precision.openvino_int8), and
  openvino-bf16  the OpenVINO IR compiled with the bf16 inference precision hint (no new file).

Every variant's logits are compared with fp32 eager on held-out images by export.precision.gate.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from contract.files import atomic_write_text
from contract.records import ImageContract
from export.forms import kinds
from export.precision.calibration import ImageSet, calibration_set, holdout_set
from export.precision.gate import (
    AccuracyGateError,
    GateResult,
    judge,
    label_targets,
    render_table,
    report_markdown,
)
from export.precision.onnx_int8 import Int8Work, weight_bits
from export.precision.request import PrecisionError, PrecisionRequest, check_hardware
from export.precision.running import images_per_s, run_batches
from export.refusals import Refusals
from runtime import RunOptions, open_artifact
from runtime.base import Backend

INT8 = kinds.get("onnx-int8")
RANGES_FILE = "int8.ranges.json"  # calibrated tensor ranges: the int8 model can be rebuilt from them
ACCURACY_FILES = ("accuracy.md", "accuracy.json")
# The int8 source (INT8.sources): an fp32 ONNX without control flow first (the quantizer and its shape
# inference handle a plain graph best); it must have passed parity and not diverge from eager.
ACTIVATION_TYPES = ("QUInt8", "QInt8")  # weights are QInt8 either way (symmetric, per channel)


@dataclass
class Variant:
    kind: str
    path: Path
    format: str
    precision: str  # what the artifact computes in: int8 | bf16 | fp16
    run_precision: str  # RunOptions.precision the backend needs (fp32 for a quantized ONNX run as-is)
    source: str  # the fp32 artifact it was made from
    made_by: dict
    gate: GateResult | None = None
    images_per_s: float | None = None

    def details(self) -> dict:
        """The manifest record's kind-specific facts."""
        return {"made_by": self.made_by, "accuracy": self.gate.as_dict() if self.gate else None,
                "images_per_s_batch1": self.images_per_s}


@dataclass
class PrecisionReport:
    variants: dict[str, Variant] = field(default_factory=dict)
    calibration: dict | None = None
    holdout: dict = field(default_factory=dict)
    ladder: dict = field(default_factory=dict)  # kind -> batch-1 images/s measured during this export
    int8_choice: dict | None = None
    notes: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[GateResult]:
        return [v.gate for v in self.variants.values() if v.gate and not v.gate.passed]

    def gate_verdicts(self) -> dict[str, str]:
        return {k: v.gate.verdict for k, v in self.variants.items() if v.gate}

    def raise_on_failure(self) -> None:
        if self.failures:
            raise AccuracyGateError(self.failures, render_table(self.failures))

    def manifest_record(self) -> dict:
        return {"precisions": [kinds.FP32, *sorted({v.precision for v in self.variants.values()})],
                "calibration": self.calibration, "holdout": self.holdout, "ladder_images_per_s_batch1": self.ladder,
                "int8_choice": self.int8_choice, "gate": self.gate_verdicts(), "notes": self.notes}


# ---------------------------------------------------------------- the step the pipeline calls

@dataclass
class VariantSources:
    """What the variants are made from: the stage they are written to, the fp32 module (the gate's reference),
    its image input contract (None: the model takes no image, and nothing can be calibrated), the fp32 artifacts
    (kind -> export.forms.exporters.Artifact), those a variant may be made from (passed parity, never diverge
    from eager) and the model's labels."""

    stage: Path
    module: torch.nn.Module
    contract: ImageContract | None
    fp32_artifacts: dict
    eligible: list[str]
    labels: list[str] | None = None


def build_variants(sources: VariantSources, request: PrecisionRequest, device: str, progress,
                   refusals: Refusals) -> PrecisionReport:
    """Builds every requested variant in the stage, gates it, writes accuracy.md/json. A variant that cannot be
    made is refused into `refusals` and the others go on; a model none can be made for raises PrecisionError."""
    from runtime.eager import EagerBackend
    if sources.contract is None:
        raise PrecisionError("reduced precision needs images to calibrate and check on, and this model has no "
                             "image input contract (input.preprocessing); export it with --precision fp32")
    report = PrecisionReport()
    check_hardware(request.precisions, device)
    calibration = None
    if "int8" in request.precisions:
        calibration = calibration_set(sources.contract, request.calibration, request.calibration_samples,
                                      request.loader_workers)
        report.calibration = calibration.describe()
        progress.step(f"calibration images: {calibration.origin} ({len(calibration)})")
    holdout = holdout_set(sources.contract, request.validation, calibration, workers=request.loader_workers)
    reference = run_batches(EagerBackend(sources.module), holdout.images)
    targets, labelled = label_targets(holdout.classes, holdout.labels, sources.labels, reference.shape[1])
    report.holdout = {**holdout.describe(), "labels": labelled}
    progress.step(f"held-out images for the accuracy gate: {holdout.origin} ({len(holdout)}); {labelled}")
    held_out = _HeldOut(holdout, reference, targets, device)

    def attempt(kind: str, make):
        """make() -> Variant, or the kind refused with the reason."""
        try:
            report.variants[kind] = make()
        except Exception as error:  # noqa: BLE001 - a variant that cannot be made is refused, the others go on
            refusals.refuse(kind, "precision", error)

    if "int8" in request.precisions:
        attempt(INT8.name, lambda: _int8_variant(sources, report, calibration, held_out, progress,
                                                 request.target_flags))
    for kind in requested_variant_kinds(request.precisions):
        if kind != INT8.name and kinds.opt_in_source_missing(kinds.get(kind), sources.fp32_artifacts):
            progress.step(f"{kind} not made: its source {kinds.get(kind).sources[0]} is built when named in --formats")
        elif kind != INT8.name:
            attempt(kind, lambda: _other_variant(sources, report, kinds.get(kind), calibration, held_out, progress))
    for kind, variant in report.variants.items():
        report.ladder[kind] = variant.images_per_s
    _write_reports(sources.stage, report, targets is not None)
    return report


@dataclass
class _HeldOut:
    """What every variant is gated on: the held-out images, fp32 eager's logits on them and their targets."""

    holdout: ImageSet
    reference: torch.Tensor
    targets: object
    device: str

    def gate(self, kind, backend: Backend) -> GateResult:
        """The kind's accuracy gate on the held-out images, run through `backend`, with the precision it ran in."""
        result = judge(kind.name, kind.precision, self.reference, run_batches(backend, self.holdout.images),
                       self.targets)
        asked = backend.options.precision  # a runtime may run another than asked (OpenVINO without native bf16)
        actual = backend.describe().get("actual_precision", asked)
        result.ran_in_precision(kind.precision if actual == asked else actual)
        return result

    def speed(self, backend: Backend) -> float:
        return images_per_s(backend, self.holdout.images[:1])


def requested_variant_kinds(precisions: tuple[str, ...]) -> list[str]:
    """The variant kinds the requested precisions make, in table order."""
    return [k.name for p in precisions if p != kinds.FP32 for k in kinds.variants(p)]


def _int8_variant(sources: VariantSources, report, calibration, held_out: _HeldOut, progress,
                  target_flags: frozenset | None = None) -> Variant:
    source = sources.fp32_artifacts[_source(INT8, sources)]
    _record_source_speed(report, source, held_out)
    with _removed_on_failure(sources.stage / RANGES_FILE, sources.stage / INT8.file_name):
        variant, report.int8_choice = build_int8(sources.stage, source, calibration, held_out, progress,
                                                 weight_bits(target_flags))
    report.files.append(RANGES_FILE)
    return variant


def _other_variant(sources: VariantSources, report, kind, calibration, held_out: _HeldOut, progress) -> Variant:
    """Its source's own file run in another precision (autocast, OpenVINO's hint), an fp16 ONNX or an OpenVINO
    int8 IR (export.precision.openvino_int8)."""
    source = sources.fp32_artifacts[_source(kind, sources)]
    if kind.file_name == source.path.name:
        return run_time_variant(kind, source, held_out)
    _record_source_speed(report, source, held_out)
    with _removed_on_failure(*(sources.stage / name for name in (kind.file_name, *kind.companions))):
        if kind.format != kinds.OPENVINO:
            return build_onnx_fp16(sources.stage, kind, source, held_out)
        from export.precision.openvino_int8 import build_openvino_int8
        made_by, gate, speed = build_openvino_int8(sources.stage, kind, source, calibration, held_out, progress)
        return Variant(kind=kind.name, path=sources.stage / kind.file_name, format=kind.format, precision=kind.precision,
                       run_precision=kinds.FP32, source=source.kind, made_by=made_by, gate=gate, images_per_s=speed)


@contextlib.contextmanager
def _removed_on_failure(*paths: Path):
    """Files a variant writes leave the export with it when it is refused."""
    try:
        yield
    except BaseException:
        for path in paths:
            path.unlink(missing_ok=True)
        raise


def _record_source_speed(report: PrecisionReport, source, held_out: _HeldOut) -> None:
    if source.kind not in report.ladder:
        backend = open_artifact(source.format, source.path, RunOptions(device=held_out.device))
        report.ladder[source.kind] = held_out.speed(backend)


def _source(kind, sources: VariantSources) -> str:
    """The first of the kind's fp32 sources that passed parity and does not diverge from eager."""
    for name in kind.sources:
        if name in sources.fp32_artifacts and name in sources.eligible:
            return name
    raise PrecisionError(f"none of {', '.join(kind.sources)} passed parity without diverging from eager, so "
                         f"there is nothing to make {kind.name} from; fix parity first (see parity.md)")


# ---------------------------------------------------------------- int8

def build_int8(stage: Path, source, calibration: ImageSet, held_out: _HeldOut, progress,
               bits: tuple[bool, str] | None = None) -> tuple[Variant, dict]:
    """Quantize `source` with both activation types; keep the fastest that passes the gate."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    work = Int8Work(stage / ".int8-work", stage / ".int8-work" / "prepared.onnx", stage / RANGES_FILE, calibration,
                     bits or weight_bits())
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
            backend = open_artifact(INT8.format, path, RunOptions(), name=f"int8 {activation}")
            speed, gate = held_out.speed(backend), held_out.gate(INT8, backend)
            candidates[activation] = (path, speed, gate)
            progress.step(f"int8 activations {activation}, weights QInt8: {speed:.1f} images/s at batch 1, gate "
                          f"{gate.verdict} (top-1 agreement {100 * gate.metrics['top1_agreement']:.1f}%)")
        chosen, why = choose_activation_type({a: (s, g.passed) for a, (_, s, g) in candidates.items()})
        path, speed, gate = candidates[chosen]
        fallback = None
        if not gate.passed:  # accuracy-aware: put the most damaging nodes back in fp32 (export.precision.int8_fallback)
            path, speed, gate, fallback = _fall_back(work, source, chosen, held_out, progress)
        shutil.move(str(path), str(stage / INT8.file_name))
    finally:
        shutil.rmtree(work.folder, ignore_errors=True)
    made_by = {"tool": "onnxruntime.quantization.quantize_static", "preprocessing": "quant_pre_process",
               "format": "QDQ", "per_channel": True, "weight_type": "QInt8", "activation_type": chosen,
               "reduce_range": work.reduce_range, "reduce_range_why": work.bits[1],
               "calibrate_method": "MinMax", "calibration_images": len(calibration), "ranges": RANGES_FILE,
               "timings": timings, "fp32_fallback": fallback}
    choice = {"chosen": chosen, "why": why,
              "measured": {a: {"images_per_s_batch1": round(s, 1), "gate": g.verdict,
                               "top1_agreement": g.metrics["top1_agreement"]} for a, (_, s, g) in candidates.items()},
              "fp32_fallback": fallback and {"nodes": [f"{r['node']} ({r['kind']})" for r in fallback["fp32_nodes"]],
                                             "images_per_s_batch1": round(speed, 1), "gate": gate.verdict}}
    variant = Variant(kind=INT8.name, path=stage / INT8.file_name, format=INT8.format, precision=INT8.precision,
                      run_precision=kinds.FP32, source=source.kind, made_by=made_by, gate=gate, images_per_s=speed)
    return variant, choice


def _fall_back(work: Int8Work, source, activation: str, held_out: _HeldOut,
               progress) -> tuple[Path, float, GateResult, dict]:
    """Re-quantize (cached ranges) with activations kept explicit, put nodes back in fp32 until the calibration
    images meet the selection target (int8_fallback.SELECTION_SHARE of the gate's tolerance), then gate the
    result on the held-out images once."""
    import onnx

    from export.precision import int8_fallback
    explicit = work.folder / f"int8-{activation}-explicit.onnx"
    work.quantize(explicit, activation, int8_fallback.QUANTIZE_OPTIONS)
    fp32 = open_artifact(source.format, source.path, RunOptions(), name="fp32 source")
    timing = work.folder / "timing.onnx"

    def speed(model) -> float:
        int8_fallback.save(model, timing)
        return held_out.speed(open_artifact(INT8.format, timing, RunOptions(), name="int8 step"))

    images = work.calibration.images
    graphs = int8_fallback.FallbackInputs(onnx.load(str(explicit)), onnx.load(str(work.prepared)), images,
                                          run_batches(fp32, images))
    model, fallback = int8_fallback.fall_back(graphs, INT8, speed, progress)
    path = work.folder / "int8-fallback.onnx"
    int8_fallback.save(model, path)
    backend = open_artifact(INT8.format, path, RunOptions(), name="int8 with fp32 fallback")
    gate = held_out.gate(INT8, backend)
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


# ---------------------------------------------------------------- bf16 / fp16

def run_time_variant(kind, source, held_out: _HeldOut) -> Variant:
    """An fp32 file run in another precision (TorchScript under torch.autocast, OpenVINO with its inference
    precision hint): no new file, a new way to run it."""
    precision = kind.precision
    backend = open_artifact(source.format, source.path, RunOptions(device=held_out.device, precision=precision))
    gate = held_out.gate(kind, backend)
    made_by = {"tool": f"{kind.exporter} ({source.path.name})", "device": held_out.device, "ran_in": gate.ran_in}
    return Variant(kind=kind.name, path=source.path, format=source.format, precision=precision,
                   run_precision=precision, source=source.kind, made_by=made_by, gate=gate,
                   images_per_s=held_out.speed(backend))


def build_onnx_fp16(stage: Path, kind, source, held_out: _HeldOut) -> Variant:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16
    model = convert_float_to_float16(onnx.load(str(source.path)), keep_io_types=True)
    onnx.save(model, str(stage / kind.file_name))
    backend = open_artifact(kind.format, stage / kind.file_name, RunOptions(device=held_out.device))
    gate = held_out.gate(kind, backend)
    made_by = {"tool": "onnxruntime.transformers.float16.convert_float_to_float16", "keep_io_types": True,
               "runs_on": "ONNX Runtime CUDAExecutionProvider"}
    return Variant(kind=kind.name, path=stage / kind.file_name, format=kind.format, precision=kind.precision,
                   run_precision=kinds.FP32, source=source.kind, made_by=made_by, gate=gate,
                   images_per_s=held_out.speed(backend))


def _write_reports(stage: Path, report: PrecisionReport, labelled: bool) -> None:
    import json
    results = [v.gate for v in report.variants.values() if v.gate]
    context = {"held-out images": f"{report.holdout['origin']} ({report.holdout['count']})",
               "labels": report.holdout["labels"],
               "calibration images": (f"{report.calibration['origin']} ({report.calibration['count']})"
                                      if report.calibration else "none (no int8)"),
               "int8 activation type": report.int8_choice or "-", "batch-1 images/s (this export)": report.ladder}
    context.update({f"note {i + 1}": note for i, note in enumerate(report.notes)})
    atomic_write_text(stage / "accuracy.md", report_markdown("reduced-precision variants", results, context))
    atomic_write_text(stage / "accuracy.json", json.dumps({**report.manifest_record(),
                                                           "results": [r.as_dict() for r in results]},
                                                          indent=2, default=str))
    report.files.extend(ACCURACY_FILES)
