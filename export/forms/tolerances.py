"""How close a form's outputs must stay to eager PyTorch's: the tolerance each row of the kinds table names.

export.checks.parity holds every fp32 form to its kind's tolerance: an output passes when
|form - eager| <= atol + rtol * |eager| element-wise. Reduced-precision variants are gated on accuracy instead
(export.precision.gate).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


# TorchScript runs the very same ATen kernels as eager, so it should agree to rounding (1e-5). ONNX Runtime fuses
# Conv+BatchNorm and sums in other orders and kernels; over the ~1e4-1e5 multiply-adds behind each ResNet logit
# that moves results by ~1e-5 relative, so rtol 1e-3 (atol 1e-4 for outputs near zero) leaves headroom for that,
# while a changed weight (errors >= 1e-2) still fails.
TORCHSCRIPT_TOLERANCE = Tolerance(atol=1e-5, rtol=1e-5)
ONNX_TOLERANCE = Tolerance(atol=1e-4, rtol=1e-3)
# torch.export's ExportedProgram is an ATen graph run by eager's own kernels: TorchScript's tolerance.
EXPORTED_PROGRAM_TOLERANCE = TORCHSCRIPT_TOLERANCE
# AOTInductor generates its own fused, vectorised kernels and folds BatchNorm into frozen weights (other
# summation orders, like ONNX Runtime's fusions): ONNX Runtime's tolerance (its errors: docs/aotinductor.md).
AOTINDUCTOR_TOLERANCE = ONNX_TOLERANCE
# OpenVINO's CPU plugin fuses and reorders like ONNX Runtime (its IR is converted from an ONNX file, run in f32 by
# an explicit precision hint): ONNX Runtime's tolerance; its errors are of the same order (docs/openvino.md).
OPENVINO_TOLERANCE = ONNX_TOLERANCE
