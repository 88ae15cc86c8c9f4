"""How close a form's outputs must stay to eager PyTorch's: the tolerance each row of the kinds table names.

export.checks.parity holds every fp32 form to its kind's tolerance: an output passes when
|form - eager| <= atol + rtol * |eager| element-wise. Reduced-precision variants are gated on accuracy instead
(export.precision.gate). A detector's outputs are sets, held to a SetTolerance (gates.boxes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from contract.records import DETECTION, DetectionLimits
from gates.boxes import SetTolerance


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float

    def describe(self) -> str:
        return f"atol={self.atol:g}, rtol={self.rtol:g}"


# TorchScript runs the very same ATen kernels as eager, so it should agree to rounding (1e-5). ONNX Runtime fuses
# Conv+BatchNorm and sums in other orders and kernels; over the ~1e4-1e5 multiply-adds behind each ResNet logit
# that moves results by ~1e-5 relative, so rtol 1e-3 (atol 1e-4 for outputs near zero) leaves headroom for that,
# while a changed weight (errors >= 1e-2) still fails.
TORCHSCRIPT_TOLERANCE = Tolerance(atol=1e-5, rtol=1e-5)
ONNX_TOLERANCE = Tolerance(atol=1e-4, rtol=1e-3)
# torch.export's ExportedProgram is an ATen graph run by eager's own kernels: TorchScript's tolerance.
EXPORTED_PROGRAM_TOLERANCE = TORCHSCRIPT_TOLERANCE
# AOTInductor generates its own fused, vectorised kernels and folds BatchNorm into frozen weights (other
# summation orders, like ONNX Runtime's fusions): ONNX Runtime's tolerance (its errors: docs/results/2026-11-24-aoti-tuning-resnet50/analysis.md).
AOTINDUCTOR_TOLERANCE = ONNX_TOLERANCE
# OpenVINO's CPU plugin fuses and reorders like ONNX Runtime (its IR is converted from an ONNX file, run in f32 by
# an explicit precision hint): ONNX Runtime's tolerance; its errors are of the same order (docs/results/2026-11-25-openvino-kinds/).
OPENVINO_TOLERANCE = ONNX_TOLERANCE

# The detection family's tolerances, as Optimum declares ATOL_FOR_VALIDATION per model: a form on eager's own
# kernels (TorchScript, torch.export) gives the very boxes; one on other kernels (ONNX Runtime, OpenVINO,
# AOTInductor) moves a box's corners and score by rounding only, an order of magnitude looser, as for logits.
SAME_KERNELS_SETS = SetTolerance(box_iou=0.999, score_atol=1e-4, edge=1e-4, mask_iou=0.99)
OTHER_KERNELS_SETS = SetTolerance(box_iou=0.99, score_atol=1e-3, edge=1e-3, mask_iou=0.95)


def held_to(kind_tolerance: Tolerance, task: str, limits: DetectionLimits | None) -> Tolerance | SetTolerance:
    """What a form of a model is held to: a classifier's logits and a segmenter's per-pixel logits element-wise
    (its kind's tolerance); a detector's boxes as sets, as strict as its kind (eager's kernels or others)."""
    if task != DETECTION:
        return kind_tolerance
    sets = SAME_KERNELS_SETS if kind_tolerance == TORCHSCRIPT_TOLERANCE else OTHER_KERNELS_SETS
    return replace(sets, limits=limits)
