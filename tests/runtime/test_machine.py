"""The machine facts a runtime or export decision depends on."""

import json
import subprocess
import sys

import pytest

from runtime import form_choice, machine
from tests.conftest import ROOT


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


# ---------------------------------------------------------------- profiles, needs and the choice at load

BF16_FAST = machine.Needs(machine.CPU, (machine.BF16_FLAGS,))
CANDIDATES = [  # as a manifest records them: an order decided at export
    {"kind": "openvino-bf16", "runs_on": machine.Needs(machine.CPU).as_dict(), "fast_on": BF16_FAST.as_dict()},
    {"kind": "onnx-int8", "runs_on": {}, "fast_on": machine.Needs(machine.CPU).as_dict()},
    {"kind": "onnx-dynamo", "runs_on": {}, "fast_on": {}},
]


@pytest.mark.parametrize(("profile", "served"), [("amx", "openvino-bf16"), ("avx512-bf16", "openvino-bf16"),
                                                  ("avx512-vnni", "onnx-int8"), ("avx2", "onnx-int8"),
                                                  ("cuda", "onnx-dynamo")])
def test_each_profile_serves_the_first_candidate_it_meets(profile, served):
    choice = form_choice.declared_choice(CANDIDATES, machine.PROFILES[profile])
    assert choice.kind == served
    assert list(choice.skipped) == [c["kind"] for c in CANDIDATES[:[c["kind"] for c in CANDIDATES].index(served)]]
    assert served in choice.line() and profile in choice.line()


def test_the_reasons_say_what_the_machine_lacks():
    avx2 = form_choice.declared_choice(CANDIDATES, machine.PROFILES["avx2"])
    assert avx2.skipped == {"openvino-bf16": "not fast here: needs avx512_bf16 or amx_bf16, which this CPU lacks"}
    cuda = form_choice.declared_choice(CANDIDATES, machine.PROFILES["cuda"])
    assert cuda.skipped["openvino-bf16"] == ("cannot run here: runs on the CPU only, and this machine serves on a "
                                             "CUDA GPU")
    assert cuda.skipped["onnx-int8"].startswith("not fast here: runs on the CPU only")


def test_a_machine_no_export_foresaw_gets_the_form_that_needs_nothing_and_none_is_an_answer_not_a_crash():
    unforeseen = machine.MachineProfile("arm", frozenset({"neon", "asimd"}))
    assert form_choice.declared_choice(CANDIDATES, unforeseen).kind == "onnx-int8"  # a CPU: int8 runs and is fast there
    gpu_only = [{"kind": "onnx-fp16", "runs_on": machine.Needs(machine.CUDA).as_dict(), "fast_on": {}}]
    nothing = form_choice.declared_choice(gpu_only, machine.PROFILES["avx2"])
    assert nothing.kind is None and "needs a CUDA GPU" in nothing.skipped["onnx-fp16"]


def test_profiles_nest_and_this_machine_is_named_by_the_richest_it_meets():
    names = [n for n, p in machine.PROFILES.items() if p.device == machine.CPU]
    for poorer, richer in zip(names, names[1:]):
        assert machine.PROFILES[poorer].flags <= machine.PROFILES[richer].flags
    for name in names:
        assert machine.profile_name(set(machine.PROFILES[name].flags) | {"sse4_2"}, cuda=False) == name
    assert machine.profile_name({"avx2", "fma"}, cuda=True) == "cuda"
    assert machine.profile_name({"sse4_2"}, cuda=False) == "generic"
    here = machine.this_machine_profile("cpu")
    assert here.device == "cpu" and here.flags == frozenset(machine.cpu_flags())


def test_needs_round_trip_through_the_manifest_form():
    needs = machine.Needs(machine.CPU, (machine.BF16_FLAGS, machine.VNNI_FLAGS))
    assert machine.Needs.from_dict(needs.as_dict()) == needs
    assert machine.Needs.from_dict({}) == machine.Needs()
    assert needs.words() == "a CPU, avx512_bf16 or amx_bf16, avx512_vnni or avx_vnni or amx_int8"


COUNT_THEN_TORCH = """
import json, sys
from runtime.machine import cuda_gpus, torch_cuda_version
counted, built_for, before = cuda_gpus(), torch_cuda_version(), "torch" in sys.modules
import torch
print(json.dumps({"counted": counted, "built_for": built_for, "imported_before": before,
                  "torch_counts": torch.cuda.device_count() if torch.cuda.is_available() else 0,
                  "torch_built_for": torch.version.cuda, "counted_after": cuda_gpus()}))
"""


def test_gpus_are_counted_as_torch_counts_them_without_importing_it():
    done = subprocess.run([sys.executable, "-c", COUNT_THEN_TORCH], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert not found["imported_before"], "counting GPUs imported torch"
    assert found["built_for"] == found["torch_built_for"]
    assert found["counted"] == found["torch_counts"] == found["counted_after"]
