"""What the signals add to one request, timed in-process: the very calls an adapter makes per request (a request id
made, the in-flight gauge, the request histogram, a batch of one's size and five stage observations, the request's
log line to a file), in multiprocess mode as the engines run them, with VISION_SIGNALS on and off, each in a fresh
process. `python docs/results/2026-11-27-signals-cost/per_request.py [REQUESTS]` prints microseconds per request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROUNDS = 5


def child(requests: int) -> float:
    import logging
    import time

    from handlers import metrics, signals
    from handlers.signals import log_batch, request_id

    logging.basicConfig(filename=os.environ["SIGNALS_LOG"], level=logging.INFO)
    served = metrics.ServedModel("resnet18", "1", "onnx-dynamo")
    stage_ms = {"decode": 3.1, "preprocess": 2.2, "inference": 40.4, "encode": 0.3}

    class Request:
        def __init__(self, rid: str) -> None:
            self.request_id = rid

    start = time.perf_counter()
    for _ in range(requests):
        timer = metrics.Timer()
        with metrics.in_flight(served.model):
            rid = request_id(None)
            metrics.observe_queue(served, 0.001)
            log_batch(served, [(Request(rid), {})], stage_ms)
            metrics.observe_request(served, 200, timer.seconds())
        signals.with_request_id({}, rid)
    return (time.perf_counter() - start) / requests * 1e6


def run(signals: str, requests: int) -> float:
    with tempfile.TemporaryDirectory(prefix=f"signals-{signals}-") as folder:
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": folder, "VISION_SIGNALS": signals,
               "SIGNALS_LOG": str(Path(folder) / "requests.log")}
        done = subprocess.run([sys.executable, __file__, "--child", str(requests)], env=env, capture_output=True,
                              text=True, check=True)
    return float(done.stdout)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        print(child(int(argv[1])))
        return 0
    requests = int(argv[0]) if argv else 20000
    rounds = [{"on_us": run("on", requests), "off_us": run("off", requests)} for _ in range(ROUNDS)]
    on = sorted(r["on_us"] for r in rounds)[ROUNDS // 2]
    off = sorted(r["off_us"] for r in rounds)[ROUNDS // 2]
    print(json.dumps({"requests_per_round": requests, "rounds": rounds, "median_on_us": round(on, 2),
                      "median_off_us": round(off, 2), "added_us_per_request": round(on - off, 2)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
