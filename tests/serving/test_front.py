"""The front door's record (serving/front.py): TorchServe's access log and Ray Serve's proxy log, line formats as the
engines write them (copied from real runs), read as they grow and across a roll-over, every prediction recorded in
vision_front_request_duration_seconds under the name it is served as, and nothing else recorded. The engines'
e2e tests check the histogram against hey's own times with a real Prometheus (tests/prometheus.py)."""

from __future__ import annotations

import os

import pytest
from prometheus_client import REGISTRY

from handlers import metrics
from serving.front import FrontFollower, FrontRecord, parse

TORCHSERVE = [
    '2026-11-28T11:42:52,985 - /127.0.0.1:58488 "POST /predictions/resnet18 HTTP/1.1" 200 35',
    '2026-11-28T10:42:17,498 - /127.0.0.1:55464 "GET /models/resnet18 HTTP/1.1" 200 1',
    '2026-11-28T11:42:55,630 - /127.0.0.1:59090 "GET /metrics HTTP/1.1" 200 10',
    '2026-11-28T11:42:56,001 - /127.0.0.1:58490 "POST /predictions/resnet18/2.0 HTTP/1.1" 503 7',
]
RAY = [
    "INFO 2026-11-28 11:10:14,603 proxy 192.0.2.2 9f322538-2833-46cf-be64-eb10ee34b5ea -- POST /predictions/resnet18 "
    "200 222.6ms",
    "INFO 2026-11-28 11:10:14,637 resnet18_resnet18 zc09ok3j fbe9e54d -- GET /-/healthz 200 0.4ms",
]


def count(model: str, code: str) -> float:
    if metrics.multiprocess_dir() is not None:
        pytest.skip("reads this process's registry: the suite runs it without PROMETHEUS_MULTIPROC_DIR")
    value = REGISTRY.get_sample_value("vision_front_request_duration_seconds_count", {"model": model, "code": code})
    return value or 0.0


def test_each_engines_line_of_a_prediction_is_read_and_nothing_else():
    assert parse(TORCHSERVE[0], "torchserve") == FrontRecord("resnet18", 200, 0.0355)  # whole ms: its middle
    assert parse(TORCHSERVE[3], "torchserve") == FrontRecord("resnet18", 503, 0.0075)  # a version's URL: its name
    assert parse(TORCHSERVE[1], "torchserve") is None and parse(TORCHSERVE[2], "torchserve") is None
    assert parse(RAY[0], "ray") == FrontRecord("resnet18", 200, 0.2226)
    assert parse(RAY[1], "ray") is None
    with pytest.raises(ValueError, match="no front log format 'nginx'"):
        FrontFollower("x.log", "nginx", ["resnet18"])


def test_the_follower_reads_what_is_written_after_it_starts_and_after_a_roll_over(tmp_path):
    log = tmp_path / "access_log.log"
    log.write_text(TORCHSERVE[0] + "\n")  # an earlier run's line: not this server's
    follower = FrontFollower(log, "torchserve", ["resnet18"])
    before = count("resnet18", "200")
    assert follower.poll() == 0
    with log.open("a") as file:
        file.write("\n".join(TORCHSERVE) + "\n" + TORCHSERVE[0][:40])  # the last line still being written
    assert follower.poll() == 2  # a 200 and a 503; management and metrics lines are not predictions
    assert count("resnet18", "200") == before + 1
    with log.open("a") as file:
        file.write(TORCHSERVE[0][40:] + "\n")
    assert follower.poll() == 1
    rolled = tmp_path / "access_log.1.log"
    os.rename(log, rolled)  # log4j2 rolls the file over: a new one starts empty
    log.write_text(TORCHSERVE[0] + "\n")
    assert follower.poll() == 1
    assert count("resnet18", "200") == before + 3
    others = tmp_path / "replicas"  # Ray's server serves its replicas' folder and follows the proxy itself
    others.mkdir()
    assert f'vision_front_request_duration_seconds_count{{code="200",model="resnet18"}} {before + 3}' in \
        metrics.exposition(others).decode()


def test_a_name_nobody_serves_is_no_series_of_its_own(tmp_path):
    pattern = tmp_path / "proxy_*.log"
    follower = FrontFollower(pattern, "ray", ["faces"])
    before = count(metrics.UNKNOWN_MODEL, "200")
    (tmp_path / "proxy_192.0.2.2.log").write_text(RAY[0] + "\n")  # a node's proxy log appearing later: read whole
    assert follower.poll() == 1
    assert count(metrics.UNKNOWN_MODEL, "200") == before + 1
    assert count("resnet18", "404") == 0
