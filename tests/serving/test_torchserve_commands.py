"""`python -m serving`'s command table: every command resolves to its function, imported only when asked
for, so `python -m measure gpu-check` runs without the virtualenv's packages."""

import importlib
import subprocess
import sys

import pytest

from serving.__main__ import COMMANDS, TORCHSERVE
from tests.conftest import ROOT


@pytest.mark.parametrize("command", [*COMMANDS, "start"])
def test_every_command_names_a_function_that_exists(command):
    module, function, _ = COMMANDS.get(command, TORCHSERVE)
    assert callable(getattr(importlib.import_module(module), function)), f"{module}:{function}"


def test_the_dispatcher_imports_no_command_until_one_is_asked_for():
    code = ("import sys; before = set(sys.modules); import serving.__main__; "
            "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in "
            "('torch', 'export', 'handlers', 'requests', 'serving') and m not in ('serving', 'serving.__main__')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


@pytest.mark.parametrize("command, usage", [("kserve", "kserve"), ("stop", "python -m serving")])
def test_help_of_a_command_is_its_own(command, usage):
    done = subprocess.run([sys.executable, "-m", "serving", command, "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and usage in done.stdout, done.stdout + done.stderr


def test_an_unknown_command_lists_every_command_without_importing_them():
    done = subprocess.run([sys.executable, "-m", "serving", "nope"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "unknown command 'nope'" in done.stderr, done.stdout + done.stderr
    assert all(command in done.stderr for command in ("start", "stop", "config", *COMMANDS)), done.stderr


@pytest.mark.parametrize("command", ["bench", "soak", "faults", "gpu-check", "pipeline", "decoders"])
def test_a_measurement_asked_of_serving_says_where_it_moved(command):
    done = subprocess.run([sys.executable, "-m", "serving", command, "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and f"python -m measure {command}" in done.stderr, done.stdout + done.stderr
