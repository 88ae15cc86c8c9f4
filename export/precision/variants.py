"""Reduced-precision variants of an export, each gated on accuracy before it may be served.

  onnx-int8      ONNX Runtime static quantization of an fp32 ONNX artifact: quant_pre_process first, then
                 quantize_static with QDQ nodes, per-channel QInt8 weights, MinMax ranges calibrated once on
                 the calibration images (cached in int8.ranges.json and reused). Activations are QUInt8 or
                 QInt8, chosen on this machine by measurement: both are built, timed and gated, and the
                 fastest that passes the gate is kept (ORT documents S8S8 as its default; U8S8 is the one
                 whose kernels use u8 x s8 dot products on x86). Both numbers and the choice are recorded.
                 When neither passes, export.precision.int8_fallback puts the most damaging nodes back in fp32, one at a
                 time, until the gate passes or its limit is reached (recorded in made_by.fp32_fallback).
  scripted-bf16  the scripted TorchScript artifact run under torch.autocast(bfloat16) (PyTorch's CPU autocast;
                 fast only on CPUs with native bf16: AVX512-BF16 or AMX).
  onnx-fp16      the fp32 ONNX converted to float16 (inputs and outputs stay float32) for ONNX Runtime's CUDA
                 provider, and
  scripted-fp16  the scripted TorchScript artifact under CUDA fp16 autocast: both need --device cuda.

Every variant's logits are compared with fp32 eager on held-out images by export.precision.gate.
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from contract.records import INPUT_NAME, ImageContract
from export.atomic import atomic_write_text
from export.forms import kinds
from export.precision.calibration import ImageSet, TensorReader, calibration_set, holdout_set
from export.precision.gate import (
    GATE_BATCH,
    AccuracyGateError,
    GateResult,
    judge,
    label_targets,
    render_table,
    report_markdown,
)
from export.precision.request import (  # noqa: F401
    BF16_CPU_FEATURES,
    PRECISIONS,
    PrecisionError,
    PrecisionRequest,
    check_hardware,
    cpu_has_native_bf16,
    parse_precisions,
)
from runtime import RunOptions, open_artifact
from runtime.base import Backend
from runtime.timing import time_runs

INT8 = kinds.get("onnx-int8")
RANGES_FILE = "int8.ranges.json"  # calibrated tensor ranges: the int8 model can be rebuilt from them
ACCURACY_FILES = ("accuracy.md", "accuracy.json")
# The int8 source (INT8.sources): an fp32 ONNX without control flow first (the quantizer and its shape
# inference handle a plain graph best); it must have passed parity and not diverge from eager.
ACTIVATION_TYPES = ("QUInt8", "QInt8")  # weights are QInt8 either way (symmetric, per channel)
SPEED_WARMUP = 2
SPEED_RUNS = 10  # batch-1 images/s, median of single calls: enough to tell 2x apart, ~1 s per model


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
        return {"precisions": ["fp32", *sorted({v.precision for v in self.variants.values()})],
                "calibration": self.calibration, "holdout": self.holdout, "ladder_images_per_s_batch1": self.ladder,
                "int8_choice": self.int8_choice, "gate": self.gate_verdicts(), "notes": self.notes}


# ---------------------------------------------------------------- the step the pipeline calls

def build_variants(stage: Path, request: PrecisionRequest, module: torch.nn.Module, contract_record,
                   fp32_artifacts: dict, eligible_sources: list[str], model_labels: list[str] | None,
                   device: str, progress, refusals=None) -> PrecisionReport:
    """fp32_artifacts: kind -> export.forms.exporters.Artifact; eligible_sources: kinds that passed parity and do not
    diverge from eager. Builds every requested variant in the stage, gates it, writes accuracy.md/json. A variant
    that cannot be made is refused into `refusals` (export.refusals.Refusals) and the others go on; without
    `refusals` its error is raised."""
    from runtime.eager import EagerBackend
    if contract_record is None:
        raise PrecisionError("reduced precision needs images to calibrate and check on, and this model has no "
                             "image input contract (input.preprocessing); export it with --precision fp32")
    contract: ImageContract = contract_record
    report = PrecisionReport()
    check_hardware(request.precisions, device)
    calibration = None
    if "int8" in request.precisions:
        calibration = calibration_set(contract, request.calibration, request.calibration_samples,
                                      request.loader_workers)
        report.calibration = calibration.describe()
        progress.step(f"calibration images: {calibration.origin} ({len(calibration)})")
    holdout = holdout_set(contract, request.validation, calibration, workers=request.loader_workers)
    reference = run_batches(EagerBackend(module), holdout.images)
    targets, labelled = label_targets(holdout.classes, holdout.labels, model_labels, reference.shape[1])
    report.holdout = {**holdout.describe(), "labels": labelled}
    progress.step(f"held-out images for the accuracy gate: {holdout.origin} ({len(holdout)}); {labelled}")
    checked = _Checked(holdout, reference, targets, device)

    def attempt(kind: str, make):
        """make() -> Variant, or the kind refused with the reason (raised when nobody records refusals)."""
        try:
            report.variants[kind] = make()
        except Exception as error:  # noqa: BLE001 - a variant that cannot be made is refused, the others go on
            if refusals is None:
                raise
            refusals.refuse(kind, "precision", error)

    if "int8" in request.precisions:
        attempt(INT8.name, lambda: _int8_variant(stage, report, fp32_artifacts, eligible_sources, calibration,
                                                 checked, progress))
    for kind in requested_variant_kinds(request.precisions):
        if kind != INT8.name:
            attempt(kind, lambda: _float_variant(stage, report, kinds.get(kind), fp32_artifacts, eligible_sources,
                                                 checked))
    for kind, variant in report.variants.items():
        report.ladder[kind] = variant.images_per_s
    _write_reports(stage, report, targets is not None)
    return report


@dataclass
class _Checked:
    """What every variant is gated on: the held-out images, fp32 eager's logits on them and their targets."""

    holdout: ImageSet
    reference: torch.Tensor
    targets: object
    device: str


def requested_variant_kinds(precisions: tuple[str, ...]) -> list[str]:
    """The variant kinds the requested precisions make, in table order."""
    return [k.name for p in precisions if p != "fp32" for k in kinds.variants(p)]


def _int8_variant(stage, report, fp32_artifacts, eligible, calibration, checked: _Checked, progress) -> Variant:
    source = fp32_artifacts[_int8_source(fp32_artifacts, eligible)]
    _record_source_speed(report, source, checked)
    with _removed_on_failure(stage / RANGES_FILE, stage / INT8.file_name):
        variant, report.int8_choice = build_int8(stage, source, calibration, checked.holdout, checked.reference,
                                                 checked.targets, progress)
    report.files.append(RANGES_FILE)
    return variant


def _float_variant(stage, report, kind, fp32_artifacts, eligible, checked: _Checked) -> Variant:
    """bf16 / fp16: autocast around the scripted TorchScript (no new file), or an fp16 ONNX."""
    source = fp32_artifacts[_source(kind, fp32_artifacts, eligible)]
    if kind.format == "torchscript":
        return autocast_variant(kind, source, checked.device, checked.holdout, checked.reference, checked.targets)
    _record_source_speed(report, source, checked)
    with _removed_on_failure(stage / kind.file_name):
        return build_onnx_fp16(stage, kind, source, checked.device, checked.holdout, checked.reference,
                               checked.targets)


@contextlib.contextmanager
def _removed_on_failure(*paths: Path):
    """Files a variant writes leave the export with it when it is refused."""
    try:
        yield
    except BaseException:
        for path in paths:
            path.unlink(missing_ok=True)
        raise


def _record_source_speed(report: PrecisionReport, source, checked: _Checked) -> None:
    if source.kind not in report.ladder:
        backend = open_artifact(source.format, source.path, RunOptions(device=checked.device))
        report.ladder[source.kind] = images_per_s(backend, checked.holdout.images[:1])


def _int8_source(artifacts: dict, eligible: list[str]) -> str:
    return _source(INT8, artifacts, eligible)


def _source(kind, artifacts: dict, eligible: list[str]) -> str:
    """The first of the kind's fp32 sources that passed parity and does not diverge from eager."""
    for name in kind.sources:
        if name in artifacts and name in eligible:
            return name
    raise PrecisionError(f"none of {', '.join(kind.sources)} passed parity without diverging from eager, so "
                         f"there is nothing to make {kind.name} from; fix parity first (see parity.md)")


# ---------------------------------------------------------------- int8

def build_int8(stage: Path, source, calibration: ImageSet, holdout: ImageSet, reference: torch.Tensor,
               targets, progress) -> tuple[Variant, dict]:
    """Quantize `source` with both activation types; keep the fastest that passes the gate."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    work = stage / ".int8-work"
    work.mkdir(exist_ok=True)
    try:
        prepared = work / "prepared.onnx"
        started = time.perf_counter()
        quant_pre_process(str(source.path), str(prepared))
        ranges = stage / RANGES_FILE
        candidates, timings = {}, {"preprocess_s": round(time.perf_counter() - started, 2)}
        for activation in ACTIVATION_TYPES:
            started = time.perf_counter()
            path = work / f"int8-{activation}.onnx"
            _quantize(prepared, path, calibration, activation, ranges)
            timings[f"quantize_{activation}_s"] = round(time.perf_counter() - started, 2)
            backend = open_artifact(INT8.format, path, RunOptions(), name=f"int8 {activation}")
            speed = images_per_s(backend, holdout.images[:1])
            gate = judge(INT8.name, INT8.precision, reference, run_batches(backend, holdout.images), targets)
            candidates[activation] = (path, speed, gate)
            progress.step(f"int8 activations {activation}, weights QInt8: {speed:.1f} images/s at batch 1, gate "
                          f"{gate.verdict} (top-1 agreement {100 * gate.metrics['top1_agreement']:.1f}%)")
        chosen, why = choose_activation_type({a: (s, g.passed) for a, (_, s, g) in candidates.items()})
        path, speed, gate = candidates[chosen]
        fallback = None
        if not gate.passed:  # accuracy-aware: put the most damaging nodes back in fp32 (export.precision.int8_fallback)
            path, speed, gate, fallback = _fall_back(work, prepared, source, chosen, ranges, calibration, holdout,
                                                     reference, targets, progress)
        shutil.move(str(path), str(stage / INT8.file_name))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    made_by = {"tool": "onnxruntime.quantization.quantize_static", "preprocessing": "quant_pre_process",
               "format": "QDQ", "per_channel": True, "weight_type": "QInt8", "activation_type": chosen,
               "calibrate_method": "MinMax", "calibration_images": len(calibration), "ranges": RANGES_FILE,
               "timings": timings, "fp32_fallback": fallback}
    choice = {"chosen": chosen, "why": why,
              "measured": {a: {"images_per_s_batch1": round(s, 1), "gate": g.verdict,
                               "top1_agreement": g.metrics["top1_agreement"]} for a, (_, s, g) in candidates.items()},
              "fp32_fallback": fallback and {"nodes": [f"{r['node']} ({r['kind']})" for r in fallback["fp32_nodes"]],
                                             "images_per_s_batch1": round(speed, 1), "gate": gate.verdict}}
    variant = Variant(INT8.name, stage / INT8.file_name, INT8.format, INT8.precision, "fp32", source.kind, made_by,
                      gate, speed)
    return variant, choice


def _quantize(prepared: Path, path: Path, calibration: ImageSet, activation: str, ranges: Path,
              extra_options: dict | None = None) -> None:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    quantize_static(str(prepared), str(path), TensorReader(calibration.images, INPUT_NAME),
                    quant_format=QuantFormat.QDQ, per_channel=True, activation_type=getattr(QuantType, activation),
                    weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax,
                    calibration_cache_path=ranges, extra_options=extra_options)


def _fall_back(work: Path, prepared: Path, source, activation: str, ranges: Path, calibration: ImageSet,
               holdout: ImageSet, reference, targets, progress) -> tuple[Path, float, GateResult, dict]:
    """Re-quantize (cached ranges) with activations kept explicit, put nodes back in fp32 until the gate passes
    on the calibration images, then gate the result on the held-out images once."""
    import onnx

    from export.precision import int8_fallback
    explicit = work / f"int8-{activation}-explicit.onnx"
    _quantize(prepared, explicit, calibration, activation, ranges, int8_fallback.QUANTIZE_OPTIONS)
    fp32 = open_artifact(source.format, source.path, RunOptions(), name="fp32 source")
    timing = work / "timing.onnx"

    def speed(model) -> float:
        int8_fallback.save(model, timing)
        return images_per_s(open_artifact(INT8.format, timing, RunOptions(), name="int8 step"), holdout.images[:1])

    model, fallback = int8_fallback.fall_back(onnx.load(str(explicit)), onnx.load(str(prepared)), calibration.images,
                                              run_batches(fp32, calibration.images), INT8.name, INT8.precision,
                                              speed, progress)
    path = work / "int8-fallback.onnx"
    int8_fallback.save(model, path)
    backend = open_artifact(INT8.format, path, RunOptions(), name="int8 with fp32 fallback")
    gate = judge(INT8.name, INT8.precision, reference, run_batches(backend, holdout.images), targets)
    progress.step(f"int8 with {len(fallback.fp32_nodes)} fp32 node(s): held-out gate {gate.verdict}")
    return path, images_per_s(backend, holdout.images[:1]), gate, fallback.record()


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

def autocast_variant(kind, source, device: str, holdout: ImageSet, reference, targets) -> Variant:
    """An fp32 TorchScript file run under torch.autocast: no new file, a new way to run it."""
    precision = kind.precision
    backend = open_artifact(source.format, source.path, RunOptions(device=device, precision=precision))
    gate = judge(kind.name, precision, reference, run_batches(backend, holdout.images), targets)
    made_by = {"tool": f"torch.autocast(dtype={precision}) around {source.path.name}", "device": device}
    return Variant(kind.name, source.path, source.format, precision, precision, source.kind, made_by, gate,
                   images_per_s(backend, holdout.images[:1]))


def build_onnx_fp16(stage: Path, kind, source, device: str, holdout: ImageSet, reference, targets) -> Variant:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16
    model = convert_float_to_float16(onnx.load(str(source.path)), keep_io_types=True)
    onnx.save(model, str(stage / kind.file_name))
    backend = open_artifact(kind.format, stage / kind.file_name, RunOptions(device=device))
    gate = judge(kind.name, kind.precision, reference, run_batches(backend, holdout.images), targets)
    made_by = {"tool": "onnxruntime.transformers.float16.convert_float_to_float16", "keep_io_types": True,
               "runs_on": "ONNX Runtime CUDAExecutionProvider"}
    return Variant(kind.name, stage / kind.file_name, kind.format, kind.precision, "fp32", source.kind, made_by, gate,
                   images_per_s(backend, holdout.images[:1]))


# ---------------------------------------------------------------- running and timing

def run_batches(backend: Backend, images: torch.Tensor, batch: int = GATE_BATCH) -> torch.Tensor:
    return torch.cat([backend(images[i:i + batch]) for i in range(0, len(images), batch)])


def images_per_s(backend: Backend, example: torch.Tensor) -> float:
    """Batch-1 images/s, median of single calls after a warm-up: recorded in the ladder, and chooses int8's
    activation type (the served artifact itself is chosen by the declared rule, never by timing)."""
    milliseconds = time_runs(lambda: backend(example), SPEED_WARMUP, SPEED_RUNS, min_seconds=0)
    return round(example.shape[0] * 1000 / statistics.median(milliseconds), 1)


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
