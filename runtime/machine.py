"""Facts of the machine a runtime decision depends on: its CPU flags, the profile it fits (avx2, avx512-vnni,
avx512-bf16, amx, cuda) and whether it meets what a form needs to run or to be fast (the choice among an archive's
forms: runtime/form_choice.py)."""

from __future__ import annotations

import ast
import ctypes
import importlib.util
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Instructions with which ONNX Runtime's x86 int8 GEMM multiplies u8 x s8 into int32 without an int16 step.
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


# Space-separated flags read instead of /proc/cpuinfo's: how tests simulate another kind of CPU (tests/simulate_cpu.py)
# in every process they start, so that an export and the server it feeds see the same machine. Compiled kernels still
# run on the real CPU.
SIMULATED_FLAGS_ENV = "VISION_EXPORT_SIMULATED_CPU_FLAGS"


def cpu_flags() -> set[str]:
    """This CPU's instruction-set flags as Linux lists them (empty where /proc/cpuinfo is not)."""
    simulated = os.environ.get(SIMULATED_FLAGS_ENV)
    if simulated is not None:
        return set(simulated.split())
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
    return is_x86(architecture) and not has_vnni(flags)


def is_x86(architecture: str | None = None) -> bool:
    return (architecture or platform.machine()).lower() in ("x86_64", "amd64", "i686", "x86")


# ---------------------------------------------------------------- GPUs, counted without importing torch

def cuda_gpus() -> int:
    """The GPUs the installed torch can use here, as torch.cuda.device_count() counts them (0 where
    torch.cuda.is_available() is False). Where torch is not imported yet, the NVIDIA driver is asked directly, as
    torch itself asks it: a process that only decides a serving policy (`python -m serving`, before it launches
    the server) then does not pay for importing torch."""
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    built_for = torch_cuda_version()
    if built_for is None:  # a CPU build of torch, or no torch
        return 0
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:  # no NVIDIA driver
        return 0
    version, count = ctypes.c_int(), ctypes.c_int()
    if driver.cuInit(0) != 0 or driver.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return 0
    if version.value < int(built_for.split(".")[0]) * 1000:  # older than torch's CUDA major: torch finds no GPU
        return 0
    return count.value if driver.cuDeviceGetCount(ctypes.byref(count)) == 0 else 0


def torch_cuda_version() -> str | None:
    """The CUDA version the installed torch was built for (torch.version.cuda), read from its version file
    without importing torch; None for a CPU build or where torch is not installed."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    try:
        tree = ast.parse(Path(spec.origin).with_name("version.py").read_text())
    except (OSError, SyntaxError):
        return None
    for node in tree.body:  # `cuda: Optional[str] = '13.0'`, or without the annotation
        targets: list[ast.expr]
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        elif isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        else:
            continue
        if any(isinstance(target, ast.Name) and target.id == "cuda" for target in targets):
            version = ast.literal_eval(value)
            return version if isinstance(version, str) else None
    return None


# ---------------------------------------------------------------- machine profiles and what a form needs of one

BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # native bf16 arithmetic; without them bf16 is emulated or ignored
CPU = "cpu"
CUDA = "cuda"
ANY_DEVICE = "any"


@dataclass(frozen=True)
class MachineProfile:
    """A serving machine as the choice of form sees it: its CPU flags and whether it serves on a CUDA GPU."""

    name: str
    flags: frozenset[str]
    device: str = CPU  # where the engine runs the model: cpu, or cuda when a GPU is there

    def describe(self) -> str:
        shown = sorted(f for f in self.flags if f in _SHOWN_FLAGS)
        return f"{self.name} ({self.device}; {' '.join(shown) or 'no AVX2'})"


_AVX2 = frozenset({"avx2", "fma"})
_AVX512 = _AVX2 | {"avx512f", "avx512bw", "avx512vl"}
# The profiles `python -m export --target` names; each is the least a machine of that kind has.
PROFILES = {
    "avx2": MachineProfile("avx2", _AVX2),
    "avx512-vnni": MachineProfile("avx512-vnni", _AVX512 | {"avx512_vnni"}),
    "avx512-bf16": MachineProfile("avx512-bf16", _AVX512 | {"avx512_vnni", "avx512_bf16"}),
    "amx": MachineProfile("amx", _AVX512 | {"avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}),
    "cuda": MachineProfile("cuda", _AVX2, device=CUDA),
}
_SHOWN_FLAGS = {flag for profile in PROFILES.values() for flag in profile.flags} | {"avx_vnni"}


def profile_name(flags: set[str], cuda: bool) -> str:
    """The richest profile these flags meet (what `--target` defaults to on this machine)."""
    if cuda:
        return "cuda"
    met = [name for name, p in PROFILES.items() if p.device == CPU and p.flags <= flags]
    return met[-1] if met else "generic"


def this_machine_profile(device: str | None = None) -> MachineProfile:
    """This machine as a profile: its real flags, and the device the engine serves on here (cuda when a GPU is
    there, unless `device` says otherwise)."""
    flags = cpu_flags()
    if device is None:
        device = CUDA if cuda_gpus() else CPU
    device = CUDA if device.startswith(CUDA) else CPU
    return MachineProfile(profile_name(flags, device == CUDA), frozenset(flags), device)


@dataclass(frozen=True)
class Needs:
    """What a form needs of a machine: the device it runs on (cpu, cuda or any) and CPU instruction sets, each
    group met by any one of its flags (checked only where it runs on the CPU)."""

    device: str = ANY_DEVICE
    cpu_any: tuple[tuple[str, ...], ...] = ()  # groups of flags: every group must be met by one of its flags

    def unmet(self, machine: MachineProfile) -> str | None:
        """Why `machine` does not meet these needs, or None when it does."""
        if self.device == CUDA and machine.device != CUDA:
            return "needs a CUDA GPU, and this machine serves on its CPU"
        if self.device == CPU and machine.device == CUDA:
            return "runs on the CPU only, and this machine serves on a CUDA GPU"
        if machine.device == CPU:
            for group in self.cpu_any:
                if not set(group) & set(machine.flags):
                    return f"needs {' or '.join(group)}, which this CPU lacks"
        return None

    def words(self) -> str:
        parts = [] if self.device == ANY_DEVICE else [f"a {self.device.upper() if self.device == CUDA else 'CPU'}"]
        parts += [" or ".join(group) for group in self.cpu_any]
        return ", ".join(parts) or "nothing"

    def as_dict(self) -> dict[str, Any]:
        return {"device": self.device, "cpu_any": [list(group) for group in self.cpu_any]}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "Needs":
        data = data or {}
        return cls(data.get("device", ANY_DEVICE), tuple(tuple(group) for group in data.get("cpu_any", ())))
