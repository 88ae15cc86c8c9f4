"""No test may pass or fail because of the CPU that runs it. The tests that read which forms a machine makes or
serves (an export's forms table and report, the choice among an archive's forms) run again here under every other
CPU profile the project simulates (tests/simulate_cpu.py), so a test that assumes a form's absence or the served form
without asking the machine fails on every machine, not only on the one that has the feature. This machine's own
profile is left out: the suite itself runs them on it.

Where the simulated profile is below this CPU, oneDNN's and ATen's ISA are capped to it too, so the export computes
as that machine would (bf16 emulated, no AMX tiles); a profile above this CPU is simulated by its flags alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from runtime.machine import CPU, PROFILES, cpu_flags, profile_name
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

# Whole modules, or tests named by `-k`, that read what this CPU makes or serves. Left out: the choice's
# measured-at-load test (it needs the trained Lite0's int8 export, minutes a profile: its decision is
# test_selection's), the kept choice's test, whose two candidates need nothing, so no profile changes which may
# serve: the profile enters only the choice's key, which the keyed test checks, and the GPU server's choice, made
# under the GPU's profile whatever the CPU (those two tests' resnet18 export, every form, was most of each
# profile's run).
CPU_DEPENDENT = ("tests/export/package/test_report.py", "tests/export/package/test_selection.py",
                 "tests/runtime/test_machine.py", "tests/runtime/test_form_choice.py")
LEFT_OUT = ("not test_an_engine_measures_once_and_serves_the_same_choice_after"
            " and not test_a_kept_choice_serves_again_until_its_form_is_changed"
            " and not test_a_gpu_server_skips_the_forms_its_runtimes_cannot_run_on_the_gpu_and_says_why")
# The most each library may use on a machine of the profile (oneDNN's ONEDNN_MAX_CPU_ISA, ATen's ATEN_CPU_CAPABILITY).
ISA_CAPS = {
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
    "avx512-vnni": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"},
    "avx512-bf16": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},
    "amx": {},
}
OTHER_PROFILES = [name for name, profile in PROFILES.items() if profile.device == CPU]


def test_every_simulated_cpu_profile_has_its_isa_caps():
    assert set(ISA_CAPS) == set(OTHER_PROFILES)  # a new profile must say how it is simulated


@pytest.mark.parametrize("profile", OTHER_PROFILES)
def test_the_tests_that_read_the_cpu_pass_on_each_simulated_cpu(profile, tmp_path):
    here = cpu_flags()
    if profile == profile_name(here, cuda=False):
        pytest.skip(f"{profile} is this machine's own profile: the suite runs these tests on it")
    below_here = PROFILES[profile].flags < frozenset(here)
    env = {**os.environ, "SIMULATE_CPU": profile, "PYTHONPATH": str(ROOT), **(ISA_CAPS[profile] if below_here else {})}
    env.pop("PYTEST_XDIST_WORKER", None)  # a run of its own, its exports its own
    ran = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.simulate_cpu", "-p", "no:cacheprovider", "-q",
                          "--basetemp", str(tmp_path / "run"), "-k", LEFT_OUT, *CPU_DEPENDENT],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert ran.returncode == 0, f"under SIMULATE_CPU={profile}:\n{ran.stdout[-6000:]}{ran.stderr[-2000:]}"
    assert " passed" in ran.stdout.splitlines()[-1]
