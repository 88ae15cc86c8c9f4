"""The held-out images every variant is gated on: fp32 eager's logits on them, a variant's gate on them, and the
batch-1 speed a variant runs at (the images are never the calibration images: export.precision.calibration)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from export.precision.calibration import ImageSet
from export.precision.gate import GATE_BATCH, MIN_CONFIDENT_IMAGES, GateResult, judge, label_targets, too_few_confident
from gates.topk import confident_rows
from runtime.base import Backend
from runtime.timing import time_runs

SPEED_WARMUP = 2
SPEED_RUNS = 10  # batch-1 images/s, median of single calls: enough to tell the activation types apart


@dataclass
class HeldOut:
    """The held-out images, fp32 eager's logits on them, and their labels as the model's output indices (None: a
    folder without matching labels, or the default images: agreement with fp32 only), with why."""

    images: ImageSet
    reference: torch.Tensor
    targets: torch.Tensor | None
    labelled: str  # how the labels were matched to the outputs, or why there are none

    @classmethod
    def judged_by(cls, eager: Backend, images: ImageSet, model_labels: list[str] | None) -> HeldOut:
        """fp32 eager run once on the images: every variant's gate compares with these logits."""
        reference = run_batches(eager, images.images)
        targets, labelled = label_targets(images.classes, images.labels, model_labels, reference.shape[1])
        return cls(images, reference, targets, labelled)

    def gate(self, kind, backend: Backend) -> GateResult:
        """The kind's accuracy gate on the held-out images, run through `backend`, with the precision it ran in."""
        result = judge(kind.name, kind.precision, self.reference, run_batches(backend, self.images.images),
                       self.targets)
        asked = backend.options.precision  # a runtime may run another than asked (OpenVINO without native bf16)
        actual = backend.describe().get("actual_precision", asked)
        result.ran_in_precision(kind.precision if actual == asked else actual)
        return result

    def speed(self, backend: Backend) -> float:
        return images_per_s(backend, self.images.images[:1])

    @property
    def can_judge(self) -> bool:
        """Whether fp32 is confident on enough of these images for top-1 agreement to mean anything (gate.py)."""
        return not too_few_confident({"confident_images": int(confident_rows(self.reference).sum())})

    def cannot_judge_note(self) -> str:
        """Why searches for a variant that passes (int8's fp32 fallback, NNCF's accuracy control) are skipped."""
        confident = int(confident_rows(self.reference).sum())
        return (f"fp32 is confident on only {confident} of the {len(self.images.images)} held-out images (the gate "
                f"needs {MIN_CONFIDENT_IMAGES}): their top-1 is decided by near ties, so no search for a variant "
                "that passes is run (int8's fp32 fallback, NNCF's accuracy control); give --validation a larger "
                "folder on which the model is confident (docs/results/2026-11-23-precision-ladder/)")


def run_batches(backend: Backend, images: torch.Tensor, batch: int = GATE_BATCH) -> torch.Tensor:
    return torch.cat([backend(images[i:i + batch]) for i in range(0, len(images), batch)])


def images_per_s(backend: Backend, example: torch.Tensor) -> float:
    """Batch-1 images/s, median of single calls after a warm-up: recorded in the ladder, and chooses int8's
    activation type (which form serves is measured on the serving machine at load: runtime/form_choice.py)."""
    milliseconds = time_runs(lambda: backend(example), SPEED_WARMUP, SPEED_RUNS, min_seconds=0)
    return round(example.shape[0] * 1000 / statistics.median(milliseconds), 1)
