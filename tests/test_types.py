"""mypy (pyproject.toml's [tool.mypy]: strict on contract/ and runtime/) finds nothing: run by `make test` and CI."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_mypy_finds_nothing():
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
