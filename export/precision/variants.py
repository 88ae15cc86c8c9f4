"""Reduced-precision variants of an export, each gated on accuracy before it may be served.

`build_variants` reads the calibration images (int8 only) and the held-out ones, runs fp32 eager on the held-out
images once, and makes each kind the request names from its fp32 source with the kind's builder (BUILDERS; each
one gates what it made on the held-out images, export.precision.gate):

  onnx-int8      ONNX Runtime static QDQ quantization, with an fp32 fallback of the most damaging nodes
                 (export.precision.onnx_int8)
  openvino-int8  NNCF post-training quantization of the OpenVINO IR (export.precision.openvino_int8)
  executorch-int8  PT2E int8 of the device program, lowered to XNNPACK (export.precision.executorch_int8)
  scripted-bf16  the scripted TorchScript artifact run under torch.autocast(bfloat16) (fast only on CPUs with
                 native bf16: AVX512-BF16 or AMX), and openvino-bf16 the OpenVINO IR under the bf16 inference
                 precision hint: no new file (export.precision.half)
  openvino-int8-bf16  openvino-int8's IR under the bf16 hint, its remainder in bf16: no new file, no second
                 quantization; built only where this machine and the target compute in bf16 (export.precision.half)
  onnx-fp16      the fp32 ONNX converted to float16, and scripted-fp16 the scripted artifact under CUDA fp16
                 autocast: both need --device cuda (export.precision.half)
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from contract.files import atomic_write_text
from contract.records import ImageContract
from export.forms import kinds
from export.precision import half
from export.precision.builder import Variant, VariantContext
from export.precision.calibration import calibration_set, holdout_set
from export.precision.executorch_int8 import build_executorch_int8
from export.precision.gate import AccuracyGateError, GateResult, render_table, report_markdown
from export.precision.held_out import HeldOut
from export.precision.onnx_int8 import build_int8
from export.precision.openvino_int8 import build_openvino_int8
from export.precision.request import PrecisionError, PrecisionRequest
from export.refusals import Refusals
from runtime import RunOptions, open_artifact
from runtime.eager import EagerBackend

INT8 = kinds.get("onnx-int8")  # its source (INT8.sources): an fp32 ONNX without control flow first
ACCURACY_FILES = ("accuracy.md", "accuracy.json")
BUILDERS = {  # kind -> build(context, kind, source) -> Variant
    INT8.name: build_int8,
    "openvino-int8": build_openvino_int8,
    "executorch-int8": build_executorch_int8,
    "openvino-int8-bf16": half.run_in_precision,
    "openvino-bf16": half.run_in_precision,
    "scripted-bf16": half.run_in_precision,
    "scripted-fp16": half.run_in_precision,
    "onnx-fp16": half.onnx_fp16,
}


@dataclass
class PrecisionReport:
    variants: dict[str, Variant] = field(default_factory=dict)
    calibration: dict | None = None
    holdout: dict = field(default_factory=dict)
    ladder: dict = field(default_factory=dict)  # kind -> batch-1 images/s measured during this export
    notes: list[str] = field(default_factory=list)

    @property
    def int8_choice(self) -> dict | None:
        """How onnx-int8's activation type was chosen (None: no onnx-int8 was made)."""
        return self.variants[INT8.name].choice if INT8.name in self.variants else None

    @property
    def files(self) -> list[str]:
        """What the variants wrote beside their artifacts, and the accuracy reports."""
        return [name for variant in self.variants.values() for name in variant.files] + list(ACCURACY_FILES)

    @property
    def failures(self) -> list[GateResult]:
        return [v.gate for v in self.variants.values() if v.gate and not v.gate.passed]

    def gate_verdicts(self) -> dict[str, str]:
        return {k: v.gate.verdict for k, v in self.variants.items() if v.gate}

    @property
    def set_aside(self) -> list[GateResult]:
        """Failures that never fail an export: of a variant that runs another variant's file another way (it
        `needs` that variant: openvino-int8-bf16, the int8 IR with its remainder in bf16), which the tool adds
        where the CPU allows; it is kept out of the candidates with its reason, as --gate report does."""
        return [g for g in self.failures if kinds.get(g.kind).needs]

    def raise_on_failure(self) -> None:
        aside = self.set_aside
        fatal = [g for g in self.failures if g not in aside]
        if fatal:
            raise AccuracyGateError(fatal, render_table(fatal))

    def manifest_record(self) -> dict:
        return {"precisions": [kinds.FP32, *sorted({v.precision for v in self.variants.values()})],
                "calibration": self.calibration, "holdout": self.holdout, "ladder_images_per_s_batch1": self.ladder,
                "int8_choice": self.int8_choice, "gate": self.gate_verdicts(), "notes": self.notes}


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
    """Builds every requested variant in the stage, gated, and writes accuracy.md/json. A variant that cannot be
    made is refused into `refusals` and the others go on; a model none can be made for raises PrecisionError."""
    context, report = _prepare(sources, request, device, progress)
    context.made = report.variants
    for name, why in request.left_out().items():
        if not kinds.opt_in_source_missing(kinds.get(name), sources.fp32_artifacts):
            progress.step(f"{name} not made: {why}")
    for kind in map(kinds.get, request.variant_kinds):
        if kinds.opt_in_source_missing(kind, sources.fp32_artifacts):
            if not request.automatic:  # the default asked for no form in particular: nothing to say about one
                progress.step(f"{kind.name} not made: its source {kind.sources[0]} is built when named in --formats")
            continue
        try:
            report.variants[kind.name] = _build(context, kind, sources, report)
            if report.variants[kind.name].gate and report.variants[kind.name].gate.passed:
                context.passed.add(kind.precision)
        except Exception as error:  # noqa: BLE001 - a variant that cannot be made is refused, the others go on
            refusals.refuse(kind.name, "precision", error)
    report.ladder.update({kind: variant.images_per_s for kind, variant in report.variants.items()})
    _write_reports(sources.stage, report)
    return report


def _prepare(sources: VariantSources, request: PrecisionRequest, device: str,
             progress) -> tuple[VariantContext, PrecisionReport]:
    """The images every variant shares: the calibration images (int8 only) and the held-out ones, with fp32
    eager's logits on them; the report records where they came from."""
    if sources.contract is None:
        raise PrecisionError("reduced precision needs images to calibrate and check on, and this model has no "
                             "image input contract (input.preprocessing); export it with --precision fp32")
    report, calibration = PrecisionReport(), None
    if "int8" in request.precisions:
        calibration = calibration_set(sources.contract, request.calibration, request.calibration_samples,
                                      request.loader_workers)
        report.calibration = calibration.describe()
        progress.step(f"calibration images: {calibration.origin} ({len(calibration)})")
    holdout = holdout_set(sources.contract, request.validation, calibration, workers=request.loader_workers)
    held_out = HeldOut.judged_by(EagerBackend(sources.module), holdout, sources.labels)
    report.holdout = {**holdout.describe(), "labels": held_out.labelled,
                      "can_judge": held_out.can_judge or held_out.cannot_judge_note()}
    progress.step(f"held-out images for the accuracy gate: {holdout.origin} ({len(holdout)}); {held_out.labelled}")
    if not held_out.can_judge:  # said before any variant is made; accuracy.md and the manifest record it too
        progress.warn(held_out.cannot_judge_note())
    return VariantContext(sources.stage, device, calibration, held_out, progress, request.target_flags,
                          request.automatic), report


def _build(context: VariantContext, kind, sources: VariantSources, report: PrecisionReport) -> Variant:
    """The kind made from its source by its builder; a new file's source is timed first, for the ladder."""
    source = sources.fp32_artifacts[_source(kind, sources)]
    if kind.file_name != source.path.name and source.kind not in report.ladder:
        backend = open_artifact(source.format, source.path, RunOptions(device=context.device))
        report.ladder[source.kind] = context.held_out.speed(backend)
    with _removed_on_failure(context.stage):
        return BUILDERS[kind.name](context, kind, source)


def _source(kind, sources: VariantSources) -> str:
    """The first of the kind's fp32 sources that passed parity and does not diverge from eager."""
    for name in kind.sources:
        if name in sources.fp32_artifacts and name in sources.eligible:
            return name
    raise PrecisionError(f"none of {', '.join(kind.sources)} passed parity without diverging from eager, so "
                         f"there is nothing to make {kind.name} from; fix parity first (see parity.md)")


@contextlib.contextmanager
def _removed_on_failure(stage: Path):
    """Files a variant writes leave the export with it when it is refused."""
    before = set(stage.iterdir())
    try:
        yield
    except BaseException:
        for path in set(stage.iterdir()) - before:
            if path.is_file():
                path.unlink(missing_ok=True)
        raise


def _write_reports(stage: Path, report: PrecisionReport) -> None:
    results = [v.gate for v in report.variants.values() if v.gate]
    context = {"held-out images": f"{report.holdout['origin']} ({report.holdout['count']})",
               "labels": report.holdout["labels"], "the gate can judge": report.holdout["can_judge"],
               "calibration images": (f"{report.calibration['origin']} ({report.calibration['count']})"
                                      if report.calibration else "none (no int8)"),
               "int8 activation type": report.int8_choice or "-", "batch-1 images/s (this export)": report.ladder}
    context.update({f"note {i + 1}": note for i, note in enumerate(report.notes)})
    atomic_write_text(stage / "accuracy.md", report_markdown("reduced-precision variants", results, context))
    atomic_write_text(stage / "accuracy.json", json.dumps({**report.manifest_record(),
                                                           "results": [r.as_dict() for r in results]},
                                                          indent=2, default=str))
