"""The machine facts a runtime or export decision depends on."""

from runtime import machine


def test_int8_weights_are_reduced_to_7_bits_only_where_the_kernels_would_saturate():
    avx2 = {"avx2", "fma", "sse4_2"}
    assert machine.int8_saturates(avx2, "x86_64")  # vpmaddubsw: u8 x s8 pairs added in int16
    assert machine.int8_saturates(avx2 | {"avx512f", "avx512bw"}, "x86_64")  # AVX-512 without VNNI: the same
    assert not machine.int8_saturates(avx2 | {"avx512_vnni"}, "x86_64")
    assert not machine.int8_saturates(avx2 | {"avx_vnni"}, "AMD64")
    assert not machine.int8_saturates({"asimd", "asimddp"}, "aarch64")  # not ONNX Runtime's x86 kernels


def test_this_machines_flags_are_read():
    flags = machine.cpu_flags()
    assert isinstance(flags, set) and all(isinstance(flag, str) for flag in flags)
