"""What a variant builder is given and what it returns, as BuildContext and Artifact are for the fp32 forms
(export.forms.exporters): every builder is `build(context, kind, source) -> Variant`, named for its kinds in
export.precision.variants.BUILDERS. A builder writes the kind's file into the stage (a variant run in another
precision writes none), gates it on the held-out images and measures its batch-1 speed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from export.precision.calibration import ImageSet
from export.precision.gate import GateResult
from export.precision.held_out import HeldOut


@dataclass
class VariantContext:
    """The stage variants are written to, the device they run on, the calibration images (int8 only), the
    held-out images they are gated on, the progress lines, and the --target machine's CPU flags (int8 weights
    must run exactly there; None: only this CPU)."""

    stage: Path
    device: str
    calibration: ImageSet | None
    held_out: HeldOut
    progress: object
    target_flags: frozenset | None = None
    automatic: bool = False  # the tool chose the precisions: a slow search is skipped once its precision has passed
    passed: set = field(default_factory=set)  # the precisions of the variants that passed their gate so far
    made: dict = field(default_factory=dict)  # kind -> Variant made so far (a kind may run another's file)


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
    files: tuple[str, ...] = ()  # what it wrote beside its artifact (int8: the calibrated ranges)
    choice: dict | None = field(default=None, repr=False)  # how it was chosen among candidates (int8's activations)

    def details(self) -> dict:
        """The manifest record's kind-specific facts."""
        return {"made_by": self.made_by, "accuracy": self.gate.as_dict() if self.gate else None,
                "images_per_s_batch1": self.images_per_s}
