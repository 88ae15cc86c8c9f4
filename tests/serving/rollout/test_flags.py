"""A canary's share outside 0 to 100 % and a shadow of no request are refused with what to give instead; a rollout
without a running server says how to start one."""

from __future__ import annotations

import argparse

import pytest

from serving.rollout.command import check_flags, main
from serving.settings import ServingError


@pytest.mark.parametrize("percent", [0.0, 100.0, -5.0])
def test_a_canary_share_outside_0_to_100_percent_is_refused(percent):
    with pytest.raises(ServingError, match="--canary .*above 0 and below 100"):
        check_flags(argparse.Namespace(canary=percent, shadow=None, photos=10))


@pytest.mark.parametrize("count", [0, -3])
def test_a_shadow_of_no_request_is_refused(count):
    with pytest.raises(ServingError, match="--shadow .*number of live requests"):
        check_flags(argparse.Namespace(canary=None, shadow=count, photos=10))


def test_without_a_running_server_the_rollout_says_how_to_start_one(tmp_path):
    with pytest.raises(ServingError, match="no server running .* --detach"):
        main("rollout", ["resnet18", str(tmp_path / "resnet18.v2.mar"), "--run-dir", str(tmp_path)])


def test_photos_are_a_count_or_a_folder_and_none_is_refused():
    from serving.rollout.command import parser_for
    parse = parser_for("rollout").parse_args
    assert parse(["faces", "v2.mar", "--photos", "4"]).photos == 4
    assert str(parse(["faces", "v2.mar", "--photos", "faces/"]).photos) == "faces"
    with pytest.raises(ServingError, match="--photos 0: give at least 1 photo, or a folder"):
        check_flags(argparse.Namespace(canary=None, shadow=None, photos=0))
