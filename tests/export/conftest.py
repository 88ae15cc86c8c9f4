"""The export tests' shared helpers: `python -m export` run in this process (no second torch import) for what
happens before or instead of an export, and the control-flow demos exported once for every test reading them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.conftest import export_in_process, made_once, run_export


@dataclass
class Ran:
    """What `python -m export ARGS` answered: the exit code and what it printed (like subprocess.run's)."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def export_main(capsys):
    """export.cli.main(ARGS) in this process, with its exit code and output; argparse's exits (--help, a usage
    error) are exit codes too. For the command's own behaviour; `python -m export` as a process is tested by a
    few tests that start one (tests.conftest.run_export)."""
    from export.cli import main

    def run(*args: str) -> Ran:
        capsys.readouterr()  # only what this command prints
        try:
            code = main([str(a) for a in args])
        except SystemExit as exit:
            code = exit.code
        printed = capsys.readouterr()
        return Ran(code, printed.out, printed.err)

    return run


@pytest.fixture(scope="session")
def controlflow_export(tmp_path_factory) -> dict:
    """`python -m export controlflow`: the control-flow demos and resnet18, each exported with every default
    kind, and the combined report."""
    out = tmp_path_factory.mktemp("controlflow") / "cf"
    result = run_export("controlflow", "--out", str(out))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {"out": out, "stdout": result.stdout, "stderr": result.stderr}


@pytest.fixture(scope="session")
def mtcnn_faces_export(tmp_path_factory) -> dict:
    """MTCNN (its trained weights) exported traced and scripted only, a few seconds: the export refuses the trace at
    parity; `explain` makes it again, report.html draws what it answers. {"out": folder, "stdout": what it printed}."""
    def make(base):
        out = base / "mtcnn"
        ran = export_in_process("detection", "--arch", "mtcnn", "--out", str(out), "--no-archive",
                                "--formats", "traced,scripted")
        assert ran.returncode == 0, ran.stderr
        (base / "stdout.txt").write_text(ran.stdout)
        return {"out": out, "stdout": base / "stdout.txt"}
    return made_once(tmp_path_factory, "mtcnn-faces", make)
