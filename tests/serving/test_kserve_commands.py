"""`python -m serving --engine kserve` without a server: choosing the engine, refusing what KServe cannot do,
and the settings the server process reads."""

from __future__ import annotations

import pytest

from handlers.policy import machine_policy
from serving.__main__ import ENGINES, TORCHSERVE, engine_of
from serving.kserve import cli
from serving.kserve.config import KServeSettings
from serving.torchserve.config import ServingError


@pytest.mark.parametrize("argv,engine,rest", [
    (["--detach"], TORCHSERVE, ["--detach"]),
    (["--engine", "kserve", "--detach"], ENGINES["kserve"], ["--detach"]),
    (["stop", "--engine=kserve", "--run-dir", "x"], ENGINES["kserve"], ["stop", "--run-dir", "x"]),
    (["--engine", "torchserve"], TORCHSERVE, []),
])
def test_the_engine_is_chosen_by_flag_and_torchserve_stays_the_default(argv, engine, rest):
    assert engine_of(argv) == (engine, rest)


def test_an_unknown_engine_is_refused_with_the_choices():
    with pytest.raises(SystemExit, match="choose from torchserve, kserve"):
        engine_of(["--engine", "ray"])


def test_token_auth_is_refused_with_the_reason(tmp_path):
    with pytest.raises(ServingError, match="KServe's ModelServer has no token authorisation"):
        cli.serve(cli.parse(["--token-auth", "--model-store", str(tmp_path)]))


def test_settings_travel_to_the_server_process_whole(tmp_path):
    settings = KServeSettings(tmp_path / "store", ("a", "b"), http_port=9999, run_dir=tmp_path / "run",
                              policy=machine_policy(0, 2))
    settings.run_dir.mkdir()
    again = KServeSettings.read(settings.write())
    assert again == KServeSettings(settings.model_store.absolute(), ("a", "b"), http_port=9999,
                                   run_dir=settings.run_dir.absolute(), policy=machine_policy(0, 2))
    assert again.predict_url("a") == "http://127.0.0.1:9999/v1/models/a:predict"
    assert again.infer_url("a") == "http://127.0.0.1:9999/v2/models/a/infer"


def test_stop_without_a_server_says_so(tmp_path, capsys):
    assert cli.main(["stop", "--run-dir", str(tmp_path)]) == 0
    assert "no KServe server running" in capsys.readouterr().out
