"""What reduced precisions were asked for, and whether this machine can build and gate them (checked by the
command line before any work; export.precision.variants builds them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from export.errors import ExportError
from export.forms import kinds
from export.precision.calibration import DEFAULT_CALIBRATION_SAMPLES
from export.precision.gate import GATE_ENFORCE
from runtime.machine import BF16_FLAGS, cpu_flags

PRECISIONS = kinds.precisions()
DEFAULT_PRECISIONS = (kinds.FP32,)

class PrecisionError(ExportError):
    """A precision cannot be built as asked (unknown name, no GPU for fp16, no image contract)."""


def parse_precisions(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(part.strip().lower() for part in text.split(",") if part.strip()))
    unknown = [n for n in names if n not in PRECISIONS]
    if unknown or not names:
        raise PrecisionError(f"--precision {text!r}: choose from {', '.join(PRECISIONS)}, comma-separated "
                             "(e.g. fp32,int8)")
    if kinds.FP32 not in names:
        raise PrecisionError(f"--precision {text!r} must include fp32: it is the reference every variant is "
                             "gated against and the fallback that is always servable (e.g. fp32,int8)")
    return names


@dataclass
class PrecisionRequest:
    precisions: tuple[str, ...] = DEFAULT_PRECISIONS
    calibration: Path | None = None
    validation: Path | None = None
    calibration_samples: int = DEFAULT_CALIBRATION_SAMPLES
    gate: str = GATE_ENFORCE  # one of export.precision.gate.GATE_MODES
    loader_workers: int | None = None
    target_flags: frozenset | None = None  # --target's CPU flags: int8 weights it must run exactly (None: this CPU)

    @property
    def wanted(self) -> bool:
        return any(p != kinds.FP32 for p in self.precisions)


def check_hardware(precisions: tuple[str, ...], device: str, flags: set[str] | frozenset[str] | None = None) -> None:
    """Refuse, before any work, a variant this machine (its CPU's `flags`; default: read here) cannot build and
    gate at a useful speed."""
    on_gpu = device.startswith("cuda")
    if "fp16" in precisions and not on_gpu:
        raise PrecisionError("fp16 variants are for GPUs and are gated on one: add --device cuda, or leave fp16 "
                             "out of --precision on a CPU-only machine")
    if "bf16" in precisions and not on_gpu and not cpu_has_native_bf16(flags):
        raise PrecisionError("bf16 on this CPU would be emulated: it has no native bf16 (" +
                             " / ".join(BF16_FLAGS) + "), and emulated bf16 is many times slower than fp32 "
                             "(docs/precision.md); use int8 on this machine, or export bf16 where the CPU has it "
                             "(or on a GPU with --device cuda)")


def cpu_has_native_bf16(flags: set[str] | frozenset[str] | None = None) -> bool:
    flags = cpu_flags() if flags is None else flags
    return any(feature in flags for feature in BF16_FLAGS)
