"""A pytest plugin that makes the code believe it runs on another kind of CPU, for the tests that read the CPU's
flags: `SIMULATE_CPU=amx pytest -p tests.simulate_cpu tests/runtime/test_aoti.py` (a profile of
runtime.machine.PROFILES; amx also gets avx512_fp16, as Sapphire Rapids has). It sets the flags in the environment
(runtime.machine.SIMULATED_FLAGS_ENV) before any test runs, so every process a test starts (an export, a server)
sees the same machine. Only what reads the flags through runtime.machine.cpu_flags is fooled; compiled kernels still
run on the real CPU (tests/test_cpu_independence.py also caps oneDNN's and ATen's ISA where the profile is below it)."""

from __future__ import annotations

import os

import pytest

from runtime import machine

EXTRA = {"amx": {"avx512_fp16"}}


def simulated_flags(name: str) -> set[str]:
    if name not in machine.PROFILES or name == "cuda":
        raise pytest.UsageError(f"SIMULATE_CPU={name!r}: choose one of "
                                f"{', '.join(p for p in machine.PROFILES if p != 'cuda')}")
    return set(machine.PROFILES[name].flags) | EXTRA.get(name, set())


def pytest_configure(config):
    """The simulated flags in this process's environment, put back at the end."""
    flags = simulated_flags(os.environ.get("SIMULATE_CPU", ""))
    before = os.environ.get(machine.SIMULATED_FLAGS_ENV)
    os.environ[machine.SIMULATED_FLAGS_ENV] = " ".join(sorted(flags))

    def put_back():
        if before is None:
            os.environ.pop(machine.SIMULATED_FLAGS_ENV, None)
        else:
            os.environ[machine.SIMULATED_FLAGS_ENV] = before

    config.add_cleanup(put_back)
