"""Reduced-precision variants of a trained detector, each gated box by box on held-out photographs.

A detector's entry that declares held-out photos (models.registry.ModelEntry.held_out, none of them a parity
probe) gets the detection kinds of the requested precisions (export.forms.kinds rows with task detection):

  scripted-bf16-backbone  the model with its networks' Conv2d and Linear layers in bf16 and everything else in
                          fp32 (export.precision.backbone), scripted; built where the CPU computes in bf16

fp32 eager answers each held-out photo once; every variant's answers are matched to those by the box-level gate
(export.precision.detections). A variant that cannot be made is refused with its reason and the export goes on;
one that fails its gate is kept out of the served candidates (--precision auto: set aside, never fatal).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from contract.files import atomic_write_text
from contract.records import DETECTION, DetectionLimits
from export.forms import kinds
from export.precision.backbone import bf16_backbone, save_scripted
from export.precision.builder import Variant
from export.precision.detections import judge_boxes, render_box_table, tolerance_lines
from export.precision.held_out import images_per_s
from export.precision.request import PrecisionError, PrecisionRequest, automatic_skip_reason, hardware_refusal
from export.precision.variants import ACCURACY_FILES, PrecisionReport, _removed_on_failure
from export.refusals import Refusals
from gates.boxes import Detections
from runtime import RunOptions, open_artifact
from runtime.base import Backend
from runtime.eager import EagerBackend


@dataclass
class DetectorSources:
    """What a detector's variants are made from: the stage, the fp32 module (the gate's reference), its fp32
    artifacts (kind -> export.forms.exporters.Artifact), those a variant may be made from (passed parity, never
    diverge from eager), the held-out photos, its limits and the example it is timed on."""

    stage: Path
    module: torch.nn.Module
    fp32_artifacts: dict
    eligible: list[str]
    held_out: Callable[[], dict[str, torch.Tensor]]
    limits: DetectionLimits
    example: torch.Tensor
    weights_kind: str


@dataclass
class HeldOutPhotos:
    """The held-out photos and fp32 eager's answer on each."""

    photos: dict[str, torch.Tensor]
    reference: dict[str, Detections]

    def describe(self) -> dict:
        return {"origin": "the model entry's held-out photographs (none of them a parity probe)",
                "count": len(self.photos), "photos": list(self.photos),
                "fp32_boxes": sum(len(answer) for answer in self.reference.values())}


def build_detector_variants(sources: DetectorSources, request: PrecisionRequest, device: str, progress,
                            refusals: Refusals) -> PrecisionReport | None:
    """Every detection kind of the requested precisions, gated, with accuracy.md/json; None when none is built
    here (each line says why)."""
    to_build = _kinds_here(sources, request, device, progress)
    if not to_build:
        return None
    held_out = _held_out(sources, device)
    report = PrecisionReport(holdout=held_out.describe())
    progress.step(f"held-out photos for the box-level gate: {len(held_out.photos)}, fp32 finds "
                  f"{report.holdout['fp32_boxes']} boxes on them")
    for kind in map(kinds.get, to_build):
        try:
            with _removed_on_failure(sources.stage):
                report.variants[kind.name] = BUILDERS[kind.name](sources, kind, held_out, device, report)
        except Exception as error:  # noqa: BLE001 - a variant that cannot be made is refused, the export goes on
            refusals.refuse(kind.name, "precision", error)
    _write_reports(sources.stage, report)
    results = [variant.gate for variant in report.variants.values() if variant.gate]
    if results:
        progress.step("box-level gate (vs fp32 eager, held-out photos):\n" + render_box_table(results))
    return report


def _kinds_here(sources: DetectorSources, request: PrecisionRequest, device: str, progress) -> list[str]:
    """The detection kinds to build, after saying why any requested precision gets none here."""
    why_not = automatic_skip_reason(request, sources.weights_kind, image_model=True)
    if why_not:
        progress.step(f"reduced precision not built: {why_not}")
        return []
    to_build = request.kinds_to_build(task=DETECTION)
    made = {kinds.get(name).precision for name in to_build}
    for precision in request.precisions:
        if precision != kinds.FP32 and precision not in made:
            progress.step(f"{precision} not made for this detector: no detection kind of {precision} runs here "
                          "(its networks run inside the scripted model; docs/results/2026-11-26-detection-exports/mtcnn.md#reduced-precision)")
    bf16_here = hardware_refusal("bf16", device)
    if request.automatic and "bf16" not in request.precisions and bf16_here:
        progress.step(f"scripted-bf16-backbone not made: {bf16_here}")
    return to_build


def _held_out(sources: DetectorSources, device: str) -> HeldOutPhotos:
    photos = sources.held_out()
    eager = EagerBackend(sources.module, RunOptions(device=device))
    return HeldOutPhotos(photos, answers(eager, photos))


def answers(backend: Backend, photos: dict[str, torch.Tensor]) -> dict[str, Detections]:
    return {name: Detections.of(backend(photo)) for name, photo in photos.items()}


def build_bf16_backbone(sources: DetectorSources, kind, held_out: HeldOutPhotos, device: str,
                        report: PrecisionReport) -> Variant:
    """scripted-bf16-backbone: the fp32 module with its Conv2d and Linear layers in bf16, scripted, gated on the
    held-out photos and timed on the example beside its fp32 source."""
    why = hardware_refusal(kind.precision, device)
    if why:
        raise PrecisionError(why)
    source = _source(kind, sources)
    model, layers = bf16_backbone(sources.module)
    path = sources.stage / kind.file_name
    save_scripted(model, path)
    backend = open_artifact(kind.format, path, RunOptions(device=device), name=f"{kind.name} candidate")
    gate = judge_boxes(kind.name, kind.precision, held_out.reference, answers(backend, held_out.photos), sources.limits)
    gate.ran_in = kind.precision
    fp32 = open_artifact(source.format, source.path, RunOptions(device=device), name=source.kind)
    report.ladder[source.kind] = images_per_s(fp32, sources.example)
    made_by = {"tool": kind.exporter, "layers_in_bf16": layers, "layout": "channels_last (convolutions)",
               "device": device, "ran_in": kind.precision}
    return Variant(kind=kind.name, path=path, format=kind.format, precision=kind.precision,
                   run_precision=kind.run_precision, source=source.kind, made_by=made_by, gate=gate,
                   images_per_s=images_per_s(backend, sources.example))


def _source(kind, sources: DetectorSources):
    for name in kind.sources:
        if name in sources.fp32_artifacts and name in sources.eligible:
            return sources.fp32_artifacts[name]
    raise PrecisionError(f"none of {', '.join(kind.sources)} passed parity without diverging from eager, so "
                         f"there is nothing to make {kind.name} from; fix parity first (see parity.md)")


BUILDERS = {"scripted-bf16-backbone": build_bf16_backbone}  # kind -> build(sources, kind, held_out, device, report)


def _write_reports(stage: Path, report: PrecisionReport) -> None:
    report.ladder.update({kind: variant.images_per_s for kind, variant in report.variants.items()})
    results = [variant.gate for variant in report.variants.values() if variant.gate]
    lines = ["# Box-level gate: reduced-precision variants of a detector", "",
             "Each variant's boxes against fp32 eager PyTorch's on held-out photos (none of them a parity probe), "
             "matched as parity matches them. A variant is servable only if it passes.", "",
             render_box_table(results), "", "## Tolerances (export/precision/gate.py)", "", *tolerance_lines(), "",
             f"- held-out photos: {json.dumps(report.holdout['photos'])}",
             f"- batch-1 images/s on the example (this export): {json.dumps(report.ladder)}"]
    atomic_write_text(stage / ACCURACY_FILES[0], "\n".join(lines) + "\n")
    atomic_write_text(stage / ACCURACY_FILES[1], json.dumps({**report.manifest_record(),
                                                             "results": [r.as_dict() for r in results]},
                                                            indent=2, default=str))
