"""Every port a start binds is checked before anything starts (serving/ports.py): a port another process holds, a
port given to two flags or an address this machine does not have is refused with the port and the flag to
change; on each engine, through `python -m serving`'s own command line, the start fails at once and leaves
nothing behind (no pid file, no run dir). The archives are empty zips: nothing may open them before the check."""

from __future__ import annotations

import os
import socket
import time
import zipfile
from contextlib import contextmanager

import pytest

from serving import cli
from serving.ports import Port, PortInUse, bind_error, check_ports
from serving.settings import free_port

QUICK_S = 10  # a refusal reads no archive and starts no process: far below any engine's start


@contextmanager
def held_port(host: str = "127.0.0.1"):
    """A port another server holds: bound and listening until the block ends."""
    with socket.socket() as holder:
        holder.bind((host, 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_a_free_port_passes_and_is_left_free():
    port = free_port()
    check_ports([Port("--inference-port", "127.0.0.1", port)])
    assert bind_error("127.0.0.1", port) is None  # the check's probe was closed at once


def test_a_held_port_is_refused_with_its_flag():
    with held_port() as port:
        with pytest.raises(PortInUse) as refused:
            check_ports([Port("--inference-port", "127.0.0.1", free_port()), Port("--signals-port", "127.0.0.1", port)])
    assert str(refused.value) == (
        f"port {port} (--signals-port) is in use on 127.0.0.1: stop what holds it or pass another --signals-port"
    )


def test_a_port_held_on_every_address_is_held_on_loopback_too():
    with held_port("0.0.0.0") as port:
        with pytest.raises(PortInUse, match=f"port {port} \\(--metrics-port\\) is in use"):
            check_ports([Port("--metrics-port", "127.0.0.1", port)])


def test_one_port_for_two_flags_an_address_not_here_and_port_zero():
    port = free_port()
    with pytest.raises(PortInUse, match=f"port {port} is given to both --inference-port and --signals-port"):
        check_ports([Port("--inference-port", "127.0.0.1", port), Port("--signals-port", "127.0.0.1", port)])
    with pytest.raises(PortInUse, match=r"cannot bind 192\.0\.2\.1:\d+ \(--inference-port\): .*pass another"):
        check_ports([Port("--inference-port", "192.0.2.1", port)])  # TEST-NET-1: no machine's own address
    check_ports([Port("--page-port", "127.0.0.1", 0), Port("--signals-port", "127.0.0.1", 0)])  # the OS's choice


@pytest.fixture
def store(tmp_path):
    folder = tmp_path / "store"
    folder.mkdir()
    zipfile.ZipFile(folder / "resnet18.mar", "w").close()
    return folder


# Per engine: its port flags, each given a free port unless the test holds it.
ENGINE_PORTS = {
    "torchserve": ("--inference-port", "--management-port", "--metrics-port", "--signals-port",
                   "--grpc-inference-port", "--grpc-management-port"),
    "kserve": ("--inference-port",),
    "ray": ("--inference-port", "--signals-port"),
}
HELD = [(engine, flag) for engine, flags in ENGINE_PORTS.items() for flag in flags
        if engine != "torchserve" or flag in ("--signals-port", "--inference-port")]


@pytest.mark.parametrize("engine, held", HELD, ids=[f"{engine} {flag}" for engine, flag in HELD])
def test_each_engine_refuses_a_held_port_before_it_starts_anything(store, tmp_path, capsys, engine, held):
    run_dir = tmp_path / "run"
    with held_port() as port:
        ports = {flag: str(free_port()) for flag in ENGINE_PORTS[engine]} | {held: str(port)}
        started = time.monotonic()
        done = cli.main(["--engine", engine, "--detach", "--model-store", str(store), "--run-dir", str(run_dir),
                         "--timeout", "5", *(word for pair in ports.items() for word in pair)])
    out, err = capsys.readouterr()
    assert done == 1 and time.monotonic() - started < QUICK_S, err
    assert f"error: port {port} ({held}) is in use on 127.0.0.1: stop what holds it or pass another {held}" in err
    assert "starting" not in out and not run_dir.exists()


def test_ray_on_a_running_cluster_checks_only_its_signals_port(store, tmp_path, capsys):
    """Serve's proxy of a cluster already serving may hold --inference-port: that port is Serve's to keep."""
    from serving.ray.config import RaySettings
    from serving.ray.engine import RayServe

    engine = RayServe(RaySettings(store, ("resnet18",), run_dir=tmp_path, address="127.0.0.1:6379",
                                  http_port=8000, signals_port=18500))
    assert engine.ports() == [Port("--signals-port", "127.0.0.1", 18500)]


def test_the_page_port_is_checked_only_where_the_page_starts():
    parser = cli.parser_for(cli.engines.get("kserve"))
    assert cli.page_ports(parser.parse_args(["--page-port", "18501"])) == [Port("--page-port", "127.0.0.1", 18501)]
    assert cli.page_ports(parser.parse_args(["--page-port", "18501", "--detach"])) == []
    assert cli.page_ports(parser.parse_args(["--page-port", "0"])) == []


def test_torchserve_says_so_when_its_signals_server_could_not_bind_after_all(tmp_path):
    """A port taken between the check and the signals server's bind: its exit is a load failure naming the port,
    so the start fails instead of printing an address another server holds."""
    from serving.torchserve.config import ServerSettings
    from serving.torchserve.engine import TorchServe, start_signals

    with held_port() as port:
        settings = ServerSettings(run_dir=tmp_path, signals_port=port)
        settings.log_dir.mkdir(parents=True)
        engine = TorchServe(settings)
        engine.signals = start_signals(settings, os.getpid())
        assert engine.signals.wait(timeout=60) == 1
    failure = engine.load_failure()
    assert failure is not None and f"the signals server for port {port} (--signals-port) exited with code 1" in failure
    assert f"cannot serve signals on 127.0.0.1:{port}: Address already in use" in failure
