"""Other machines, made from this one's facts: tests that pretend an artifact came from another CPU name
instructions this CPU lacks, chosen when the test runs, so no test depends on which CPU runs it."""

from __future__ import annotations

from runtime.machine import cpu_flags

# Real x86 flags, newest first; a CPU that had every one would get invented names instead.
RECENT_X86_FLAGS = ("apx_f", "avx10_2", "amx_fp16", "amx_complex", "amx_tile", "avx512_fp16", "amx_bf16",
                    "amx_int8", "avx512_bf16", "avx512_vnni", "avx_vnni", "avx512f", "avx2")


def flags_this_cpu_lacks(count: int = 2) -> list[str]:
    """`count` instruction-set flags that this CPU does not list, real ones where it lacks enough."""
    here = cpu_flags()
    lacking = [flag for flag in RECENT_X86_FLAGS if flag not in here][:count]
    return sorted(lacking + [f"isa_from_the_future_{i}" for i in range(count - len(lacking))])


def isa_this_cpu_cannot_run(runnable: list[str]) -> str:
    """An Inductor vector-ISA name not in `runnable` (what torch says this CPU can run)."""
    return next((isa for isa in ("amx avx512_fp16", "amx", "avx512 avx512_vnni", "avx512", "avx2")
                 if isa not in runnable), "isa_from_the_future")
