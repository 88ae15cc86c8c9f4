"""A pytest plugin that makes the code believe it runs on another kind of CPU, for the unit tests that read the
CPU's flags: `SIMULATE_CPU=amx pytest -p tests.simulate_cpu tests/runtime/test_aoti.py` (a profile of
runtime.machine.PROFILES; amx also gets avx512_fp16, as Sapphire Rapids has). Only what reads /proc/cpuinfo
through runtime.machine.cpu_flags is fooled; compiled kernels still run on the real CPU, so end-to-end tests
are not meant to run under it."""

from __future__ import annotations

import os
import sys

import pytest

from runtime import machine

EXTRA = {"amx": {"avx512_fp16"}}


def simulated_flags() -> set[str]:
    name = os.environ.get("SIMULATE_CPU", "")
    if name not in machine.PROFILES or name == "cuda":
        raise pytest.UsageError(f"SIMULATE_CPU={name!r}: choose one of "
                                f"{', '.join(p for p in machine.PROFILES if p != 'cuda')}")
    return set(machine.PROFILES[name].flags) | EXTRA.get(name, set())


def pytest_configure(config):
    """runtime.machine.cpu_flags answers the simulated flags before any test module is imported, so every
    `from runtime.machine import cpu_flags` made during collection binds the simulated one; put back at the end."""
    flags, original = simulated_flags(), machine.cpu_flags
    simulated = lambda: set(flags)  # noqa: E731
    already = [module for module in list(sys.modules.values()) if getattr(module, "cpu_flags", None) is original]
    for module in already:
        module.cpu_flags = simulated
    config.add_cleanup(lambda: [setattr(module, "cpu_flags", original) for module in already])
