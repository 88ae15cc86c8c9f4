"""`python -m serving`'s command line (serving/cli.py), run in this process: the engine chosen by --engine (its
options, its help), the commands of their own (deploy) and those that moved, and what is refused with a
reason. One test runs `python -m serving` itself."""

from __future__ import annotations

import subprocess
import sys

import pytest

from serving import cli
from tests.conftest import ROOT


def imported_by(*argv: str) -> tuple[str, set[str]]:
    """(stdout, the modules imported) of `python -m serving ARGV` run in a subprocess."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "serving", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                         if line.startswith("import time")}


def test_python_m_serving_answers_help_without_importing_torch_or_any_engine_package():
    said, imported = imported_by("--help")
    heavy = {name for name in imported if name.split(".")[0] in ("torch", "requests", "kserve", "export", "models")}
    assert "usage: python -m serving" in said and "serving.cli" in imported and not heavy, sorted(heavy)


def test_the_rollout_command_starts_without_torch_its_gate_imports_the_comparators_when_it_runs():
    said, imported = imported_by("rollout", "--help")
    heavy = {name for name in imported if name.split(".")[0] in ("torch", "torchvision") or name == "gates.boxes"}
    assert "usage:" in said and "serving.rollout.command" in imported and not heavy, sorted(heavy)


def usage_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit:
        cli.main(argv)
    assert exit.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, engine", [
    ([], "torchserve"),
    (["--detach"], "torchserve"),
    (["--engine", "kserve", "--detach"], "kserve"),
    (["stop", "--engine=kserve", "--run-dir", "x"], "kserve"),
    (["--model-store", "store", "--engine", "torchserve"], "torchserve"),
])
def test_the_engine_is_chosen_by_flag_and_torchserve_stays_the_default(argv, engine):
    assert cli.chosen_engine(argv) == engine
    args = cli.parser_for(cli.engines.get(engine)).parse_args(argv)
    assert args.engine == engine and args.action == ("stop" if "stop" in argv else "start")


def test_an_unknown_engine_is_refused_with_the_choices(capsys):
    assert "invalid choice: 'nope' (choose from 'torchserve', 'kserve', 'ray')" in usage_error(["--engine", "nope"],
                                                                                              capsys)


def test_an_unknown_command_lists_every_command(capsys):
    err = usage_error(["nope"], capsys)
    assert "invalid choice: 'nope' (choose from 'start', 'stop', 'config', 'deploy')" in err


@pytest.mark.parametrize("argv, own, others", [
    (["--help"], ["--management-port", "--token-auth", "--config", "{start,stop,config,deploy}"], ["--host"]),
    (["stop", "--engine", "kserve", "--help"], ["--host", "--http-port", "--token-auth", "{start,stop,deploy}"],
     ["--management-port"]),
])
def test_each_engines_help_lists_its_own_options_beside_the_shared_ones(argv, own, others, capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(argv)
    out = capsys.readouterr().out
    assert exit.value.code == 0 and out.startswith("usage: python -m serving")
    for option in ["--engine", "--model-store", "--models", "--run-dir", "--detach", "--workers", *own]:
        assert option in out, option
    assert not [option for option in others if option in out]


def test_an_option_of_another_engine_is_refused(capsys):
    assert "unrecognized arguments: --host=0.0.0.0" in usage_error(["--host=0.0.0.0"], capsys)
    assert "unrecognized arguments: --management-port=1" in usage_error(["--engine", "kserve", "--management-port=1"],
                                                                       capsys)
    assert "invalid choice: 'config'" in usage_error(["--engine", "kserve", "config"], capsys)


def test_deploy_is_a_command_of_its_own(capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(["deploy", "kserve", "--help"])
    assert exit.value.code == 0 and "usage: python -m serving deploy kserve" in capsys.readouterr().out
    assert "deploy comes first" in usage_error(["--detach", "deploy"], capsys)


@pytest.mark.parametrize("command, now", [
    *[(name, f"python -m measure {name}") for name in ("bench", "soak", "faults", "gpu-check", "pipeline", "decoders")],
    ("kserve", "python -m serving deploy kserve"), ("triton", "python -m serving deploy triton"),
])
def test_a_command_that_moved_says_where(command, now, capsys):
    assert cli.main([command, "--help"]) == 2
    assert f"`python -m serving {command}` moved: run `{now}`" in capsys.readouterr().err


def test_token_auth_is_one_switch_on_every_engine(capsys):
    for engine in ("torchserve", "kserve", "ray"):
        with pytest.raises(SystemExit):
            cli.main(["--engine", engine, "--help"])
        assert "--token-auth" in capsys.readouterr().out, engine


def test_stop_without_a_server_says_so_whatever_the_engine(tmp_path, capsys):
    for engine in ("torchserve", "kserve"):
        assert cli.main(["stop", "--engine", engine, "--run-dir", str(tmp_path)]) == 0
        assert capsys.readouterr().out == f"no server running from {tmp_path.absolute()}\n"
