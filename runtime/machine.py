"""Facts of the machine a runtime decision depends on."""

from __future__ import annotations

import platform
from pathlib import Path

# Instructions with which ONNX Runtime's x86 int8 GEMM multiplies u8 x s8 into int32 without an int16 step.
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def cpu_flags() -> set[str]:
    """This CPU's instruction-set flags as Linux lists them (empty where /proc/cpuinfo is not)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def has_vnni(flags: set[str]) -> bool:
    return any(flag in flags for flag in VNNI_FLAGS)


def int8_saturates(flags: set[str], architecture: str | None = None) -> bool:
    """Whether ONNX Runtime's u8 x s8 kernels may saturate here: on x86 without VNNI they add pairs of products in
    int16 (vpmaddubsw), which overflows for large weights; ONNX Runtime's quantization guide says to quantize the
    weights to 7 bits (reduce_range) on such CPUs."""
    architecture = (architecture or platform.machine()).lower()
    return architecture in ("x86_64", "amd64", "i686", "x86") and not has_vnni(flags)
