"""`python -m measure attack` against a real server of ours (the signals server, in this process): each attack
reported, the normal request answered, the exit code saying so; and a server that stops answering fails it."""

from __future__ import annotations

import json
import os

from measure.reliability.attack import main
from serving.signals import serve_signals


def test_attack_reports_each_read_and_passes_a_server_that_stays_up(tmp_path):
    server = serve_signals("127.0.0.1", 0, lambda: [])
    url = f"http://127.0.0.1:{server.server_address[1]}/health/ready"
    try:
        code = main([url, "--method", "GET", "--pid", str(os.getpid()), "--out", str(tmp_path / "rows.jsonl"),
                     "--attacks", "length-minus-1", "many-connections"])
    finally:
        server.shutdown()
        server.server_close()
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert code == 0 and [row["attack"] for row in rows] == ["length-minus-1", "many-connections"]
    crowd = rows[1]
    assert crowd["held"] + crowd["answered"] == crowd["opened"] and crowd["normal_while_held"]["status"] == 503
    assert all(row["normal_after"]["status"] == 200 for row in rows)


def test_attack_fails_a_server_that_does_not_answer(tmp_path):
    server = serve_signals("127.0.0.1", 0, lambda: ["resnet18: not loaded"])  # answers 503: not a normal answer
    url = f"http://127.0.0.1:{server.server_address[1]}/health/ready"
    try:
        assert main([url, "--method", "GET", "--pid", str(os.getpid()), "--attacks", "length-minus-1"]) == 1
    finally:
        server.shutdown()
        server.server_close()
