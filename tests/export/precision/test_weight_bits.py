"""The int8 weights' width follows every CPU the file must run on exactly: this one and the --target machine. On
x86 without VNNI ONNX Runtime's u8 x s8 kernels saturate, so 7-bit weights (reduce_range) are needed there; the
exporting CPU is simulated by its flags, as the serving choice's tests simulate machines."""

from __future__ import annotations

import platform

import pytest

from export.precision import onnx_int8
from runtime import machine
from runtime.machine import PROFILES

pytestmark = pytest.mark.skipif(not machine.is_x86(), reason=f"saturation is an x86 matter ({platform.machine()})")


@pytest.fixture
def exporting_on(monkeypatch):
    def simulate(profile: str) -> None:
        monkeypatch.setattr(machine, "cpu_flags", lambda: set(PROFILES[profile].flags))
    return simulate


def test_a_cpu_without_vnni_quantizes_7_bit_weights_for_any_target(exporting_on):
    exporting_on("avx2")
    for target in (None, PROFILES["avx512-vnni"].flags):
        reduce, why = onnx_int8.weight_bits(target)
        assert reduce and why.startswith("7-bit weights: this CPU has no VNNI")


def test_a_vnni_cpu_exporting_for_an_avx2_target_quantizes_7_bit_weights(exporting_on):
    exporting_on("avx512-vnni")
    assert onnx_int8.weight_bits(None) == (False, "8-bit weights: this CPU's int8 kernels do not saturate "
                                                  "(VNNI, or not x86)")
    reduce, why = onnx_int8.weight_bits(PROFILES["avx2"].flags)
    assert reduce and "the --target machine has no VNNI" in why
    assert onnx_int8.weight_bits(PROFILES["amx"].flags)[0] is False  # both have VNNI: full 8-bit weights
