"""How ONNX Runtime's int8 is quantized: the weights' width for the CPUs it must run on, and the static QDQ
quantization with cached calibration ranges (export.precision.variants builds and gates it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from contract.records import INPUT_NAME
from export.precision.calibration import ImageSet, TensorReader
from runtime import machine

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
