"""--canary and --shadow are refused, with the engine's reason, where the engine cannot split or mirror traffic (a
canary's share outside 0 to 100 % everywhere); and a rollout without a running server says how to start one."""

from __future__ import annotations

import argparse

import pytest

from contract.policy import ServingPolicy
from serving.kserve.config import KServeSettings
from serving.rollout.command import main, refuse_what_cannot_be_honest
from serving.rollout.kserve import KServeSwitchboard
from serving.rollout.torchserve import TorchServeSwitchboard
from serving.settings import ServingError


def torchserve_board(run_dir) -> TorchServeSwitchboard:
    (run_dir / "config.properties").write_text("inference_address=http://127.0.0.1:1\n"
                                               "management_address=http://127.0.0.1:2\nmodel_store=/tmp\n")
    return TorchServeSwitchboard(run_dir)


def kserve_board(run_dir) -> KServeSwitchboard:
    policy = ServingPolicy(workers=1, batch_size=1, max_batch_delay_ms=5, threads_per_worker=1, device="cpu",
                           reason="tests")
    KServeSettings(run_dir=run_dir, models=("m",), http_port=1, policy=policy).write()
    return KServeSwitchboard(run_dir)


@pytest.mark.parametrize("board,flag,value", [(torchserve_board, "canary", 10.0), (torchserve_board, "shadow", 5)])
def test_a_flag_the_engine_cannot_honour_is_refused_with_its_reason(board, flag, value, tmp_path):
    args = argparse.Namespace(**{"canary": None, "shadow": None, flag: value})
    with pytest.raises(ServingError, match=f"--{flag}: .*(cannot|no way).*roll out without it"):
        refuse_what_cannot_be_honest(board(tmp_path), args)


@pytest.mark.parametrize("percent", [0.0, 100.0, -5.0])
def test_a_canary_share_outside_0_to_100_percent_is_refused(percent, tmp_path):
    args = argparse.Namespace(canary=percent, shadow=None)
    with pytest.raises(ServingError, match="--canary .*above 0 and below 100"):
        refuse_what_cannot_be_honest(kserve_board(tmp_path), args)


def test_without_a_running_server_the_rollout_says_how_to_start_one(tmp_path):
    with pytest.raises(ServingError, match="no server running .* --detach"):
        main("rollout", ["resnet18", str(tmp_path / "resnet18.v2.mar"), "--run-dir", str(tmp_path)])
