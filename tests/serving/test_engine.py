"""A new engine is one class registered with serving/engine.py, and no other edit: the fake engine of
tests/serving/fake_engine.py (a small HTTP server with a worker process) is offered by --engine, started until
every model has answered, printed as the others are, stopped with its whole process group, and found by
`python -m serving stop --run-dir` from its pid file, on the code path TorchServe and KServe take."""

from __future__ import annotations

import io
import os
import re
import signal
import socket
import subprocess
import sys
import time
import zipfile

import pytest
import requests

from serving import cli
from serving import engine as engines
from serving.processes import LogFollower, group_alive
from serving.settings import ServingError, free_port
from tests.conftest import ROOT
from tests.serving.fake_engine import FakeEngine, FakeSettings

CAT = ROOT / "examples" / "cat.jpg"
NO_PAGE = ("--page-port", "0")  # in the foreground: no try-it page (its default port may be another's)
# What an engine provides; nothing else of it is asked for. Abstract: every engine writes them. Overridden: the
# base's default refuses (a fake engine may), every engine this project ships provides them.
ABSTRACT = {"launch", "ports", "probe", "exit_reason", "log_files", "announcement", "urls", "curl_line"}
OVERRIDDEN = {"on_free_ports",  # settings on free ports: tests and measure/ start it beside other servers
              "switchboard"}  # what `python -m serving rollout` drives: versions, and handlers/routing.py's transport
ATTRIBUTES = {"name", "title", "settings_type"}
ANSWER = {"model": "a", "artifact": "fake", "predictions": [{"label": "tabby", "index": 281, "probability": 0.5}]}


@pytest.fixture
def fake():
    engines.register(FakeEngine)
    yield FakeEngine
    engines.unregister(FakeEngine.name)


@pytest.fixture
def store(tmp_path):
    """A model store of two archives: the fake engine only needs them to be there, and readable (every engine's
    start resolves each model's serving policy with what its archive pins: nothing, here)."""
    folder = tmp_path / "store"
    folder.mkdir()
    for name in ("a", "b"):
        zipfile.ZipFile(folder / f"{name}.mar", "w").close()
    return folder


def group_members(pgid: int) -> list[str]:
    return subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True).stdout.split()


def with_fake_engine(*args: str) -> list[str]:
    """`python -m serving ARGS` with the fake engine registered."""
    return [sys.executable, "-m", "tests.serving.fake_engine", *args]


def lines_until_ready(server: subprocess.Popen) -> list[str]:
    """What the foreground command printed before "Ctrl-C to stop"."""
    lines = []
    for line in server.stdout:
        if line == "Ctrl-C to stop\n":
            return lines
        lines.append(line)
    pytest.fail(f"it ended before it was ready: {''.join(lines)}")


def test_registered_it_is_offered_by_engine_and_unregistered_it_is_gone(fake):
    assert engines.names()[0] == engines.DEFAULT_ENGINE and {"torchserve", "kserve", "fake"} <= set(engines.names())
    assert engines.get("fake") is FakeEngine and cli.chosen_engine(["--engine", "fake", "--detach"]) == "fake"
    engines.unregister("fake")
    assert "fake" not in engines.names()
    with pytest.raises(ServingError, match="no engine named 'fake': choose from torchserve, kserve"):
        engines.get("fake")
    engines.register(FakeEngine)  # for the fixture to unregister


def test_a_second_engine_of_the_same_name_is_refused(fake):
    class Impostor(FakeEngine):
        pass
    with pytest.raises(ValueError, match="an engine named 'fake' is registered already"):
        engines.register(Impostor)


def test_running_waits_for_every_model_and_stops_the_whole_group(fake, store, tmp_path):
    engine = FakeEngine(FakeSettings(store, ("a", "b"), run_dir=tmp_path / "run", port=free_port()))
    with engine.running(CAT, timeout=30) as process:
        assert engine.wait_until_ready(process, CAT, timeout=5) == {"a": ANSWER, "b": {**ANSWER, "model": "b"}}
        assert engine.pid_file == tmp_path.absolute() / "run" / "fake.pgid"
        assert engine.pid_file.read_text() == str(process.pid) and len(group_members(process.pid)) == 2
        assert [type(found) for found in engines.engines_running_in(tmp_path / "run")] == [FakeEngine]
        with pytest.raises(ServingError, match="the fake server started from .* is still running: `python -m "
                                               "serving stop --engine fake --run-dir .*` first"):
            engine.start()
    assert not group_alive(process.pid), "the worker outlived stop()"  # it takes a second to exit: stop waited
    assert not engine.pid_file.exists() and engines.engines_running_in(tmp_path / "run") == []


def test_a_server_that_exits_is_reported_with_its_reason_and_its_group_stopped(
    fake, store, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("FAKE_LOAD_S", "never")  # the fake server's start fails on it
    done = cli.main(["--engine", "fake", "--detach", "--model-store", str(store), "--run-dir", str(tmp_path),
                     "--port", str(free_port()), "--workers", "1", "--timeout", "30"])
    err = capsys.readouterr().err
    assert done == 1 and "error: the fake server exited with code 1: " in err
    assert "could not convert string to float: 'never'" in err
    assert "the fake server stopped" in err and not (tmp_path / "fake.pgid").exists()


@pytest.mark.parametrize("held", ["--port", "--page-port"])
def test_a_port_held_by_another_process_fails_the_start_before_anything_starts(
    fake, store, tmp_path, capsys, monkeypatch, held
):
    """Its own port (Engine.ports) and, in the foreground, the try-it page's: the error names the port and the flag,
    and nothing was started (no pid file, no log)."""
    monkeypatch.setenv("FAKE_LOAD_S", "never")  # were it started after all, it would fail rather than serve on
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = {"--port": str(free_port()), "--page-port": str(free_port()), held: str(port)}
        started = time.monotonic()
        done = cli.main(["--engine", "fake", "--model-store", str(store), "--run-dir", str(tmp_path / "run"),
                         *(word for flag, value in ports.items() for word in (flag, value)), "--workers", "1"])
    out, err = capsys.readouterr()
    assert done == 1 and time.monotonic() - started < 10
    assert f"error: port {port} ({held}) is in use on 127.0.0.1: stop what holds it or pass another {held}" in err
    assert "fake server starting" not in out and not (tmp_path / "run").exists()


def test_one_port_given_to_two_flags_is_refused(fake, store, tmp_path, capsys):
    port = str(free_port())
    assert cli.main(["--engine", "fake", "--model-store", str(store), "--run-dir", str(tmp_path / "run"),
                     "--port", port, "--page-port", port]) == 1
    assert f"port {port} is given to both --port and --page-port: each needs its own" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_the_command_line_starts_it_detached_and_stop_finds_it_by_its_pid_file(fake, store, tmp_path, capsys):
    run_dir, port = tmp_path / "run", free_port()
    started = subprocess.run(with_fake_engine("--engine", "fake", "--detach", "--model-store", str(store), "--run-dir",
                                              str(run_dir), "--port", str(port), "--workers", "1"),
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    pgid = int((run_dir / "fake.pgid").read_text())
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        url = f"http://127.0.0.1:{port}/predictions/a"
        assert started.stdout.splitlines()[:4] == [
            "fake server starting with a, b", f"serving a (fake) at {url}", "  example prediction: tabby (0.500)",
            f"  try: curl -X POST {url} --data-binary @{CAT}"]
        assert "metrics:" not in started.stdout  # it has none
        assert started.stdout.splitlines()[-1] == f"stop with: python -m serving stop --engine fake --run-dir {run_dir}"
        assert group_alive(pgid) and len(group_members(pgid)) == 2
    finally:
        assert cli.main(["stop", "--run-dir", str(run_dir)]) == 0  # no --engine: found by its pid file
    assert capsys.readouterr().out == "the fake server stopped\n"
    assert not group_alive(pgid) and not (run_dir / "fake.pgid").exists()
    assert cli.main(["stop", "--run-dir", str(run_dir)]) == 0
    assert capsys.readouterr().out == f"no server running from {run_dir.absolute()}\n"


def test_in_the_foreground_sigterm_stops_it_and_its_workers(store, tmp_path):
    run_dir = tmp_path / "run"
    server = subprocess.Popen(with_fake_engine("--engine", "fake", "--model-store", str(store), "--models", "b",
                                               "--run-dir", str(run_dir), "--port", str(free_port()), "--workers", "1",
                                               *NO_PAGE),
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert lines_until_ready(server)[0] == "fake server starting with b\n"
        pgid = int((run_dir / "fake.pgid").read_text())
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
    finally:
        server.kill()
    assert "the fake server stopped" in server.stdout.read()
    assert not group_alive(pgid) and not (run_dir / "fake.pgid").exists()


def test_sigterm_while_the_models_load_stops_the_server_too(store, tmp_path):
    run_dir = tmp_path / "run"
    server = subprocess.Popen(with_fake_engine("--engine", "fake", "--model-store", str(store), "--run-dir",
                                               str(run_dir), "--port", str(free_port()), "--workers", "1", *NO_PAGE),
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "FAKE_LOAD_S": "60"})
    try:
        assert server.stdout.readline() == "fake server starting with a, b\n"  # and waiting for its answers
        pgid = int((run_dir / "fake.pgid").read_text())
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 130
    finally:
        server.kill()
    assert "interrupted; the fake server stopped" in server.stdout.read()
    assert not group_alive(pgid) and not (run_dir / "fake.pgid").exists()


def test_follow_logs_copies_the_servers_log_lines_to_stdout_while_it_serves(store, tmp_path):
    """What a container's entrypoint runs, so that `docker logs` has what the server says (here: its access log)."""
    run_dir, port = tmp_path / "run", free_port()
    server = subprocess.Popen(with_fake_engine("--engine", "fake", "--model-store", str(store), "--models", "b",
                                               "--run-dir", str(run_dir), "--port", str(port), "--workers", "1",
                                               "--follow-logs", *NO_PAGE),
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines_until_ready(server)
        assert requests.post(f"http://127.0.0.1:{port}/predictions/nothing", data=b"x", timeout=10).status_code == 404
        time.sleep(1.5)  # the follower looks every half second
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
    finally:
        server.kill()
    after_ready = server.stdout.read()
    assert "listening" in after_ready and '"POST /predictions/b HTTP/1.1" 200' in after_ready  # the readiness probe
    assert '"POST /predictions/nothing HTTP/1.1" 404' in after_ready


def test_the_log_follower_waits_for_a_file_and_a_whole_line_and_reads_a_file_written_anew_from_its_start(tmp_path):
    log, out = tmp_path / "server.log", io.StringIO()
    follower = LogFollower([log], out)
    follower.pump()  # not written yet
    log.write_text("one\ntw")
    follower.pump()
    assert out.getvalue() == "one\n"  # "tw" is still being written
    with open(log, "a") as appended:
        appended.write("o\n")
    follower.pump()
    assert out.getvalue() == "one\ntwo\n"
    log.write_text("new\n")  # the server started again and wrote its log anew (truncated)
    follower.pump()
    assert out.getvalue() == "one\ntwo\nnew\n"


def test_every_engine_provides_the_interface_and_the_rollout_asks_it_for_its_switchboard(tmp_path):
    assert engines.Engine.__abstractmethods__ == ABSTRACT  # this list is the interface: a change updates it
    for name in engines.names():
        kind = engines.get(name)
        assert not kind.__abstractmethods__ and all(getattr(kind, attribute, None) for attribute in ATTRIBUTES)
        assert [method for method in OVERRIDDEN if getattr(kind, method) == getattr(engines.Engine, method)] == []
        settings = kind.on_free_ports(tmp_path / "store", tmp_path / name, ("a",))
        assert isinstance(settings, kind.settings_type) and settings.served_models() == ("a",)
        with pytest.raises(ServingError, match="run config"):  # no server runs there: its own switchboard says so
            kind(settings).switchboard()
    branches = re.compile(r'(==|!=)\s*"(' + "|".join(engines.names()) + r')"')
    rollout = [*(ROOT / "serving" / "rollout").glob("*.py"), ROOT / "serving" / "engine.py"]
    assert [path.name for path in rollout if branches.search(path.read_text())] == []  # no branch on a name
