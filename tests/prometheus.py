"""A real Prometheus (Debian's `prometheus`) on loopback, scraping an engine's metrics address with the scrape
config the product writes (serving/signals.py), and hey's load run beside it: what the e2e tests of each engine
use to hold the served histograms to the load generator's own percentiles."""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from handlers.metrics import LATENCY_BUCKETS
from serving.settings import free_port
from serving.signals import scrape_config

PROMETHEUS = "prometheus"
SCRAPE_S = 1  # tests scrape every second: a short load run gives Prometheus enough samples
START_TIMEOUT_S = 60
SCRAPED_TIMEOUT_S = 30


@dataclass
class Prometheus:
    url: str

    def query(self, expression: str, at: float | None = None) -> list:
        params = {"query": expression, **({"time": f"{at:.3f}"} if at else {})}
        answer = requests.get(f"{self.url}/api/v1/query", params=params, timeout=30).json()
        assert answer["status"] == "success", (expression, answer)
        return answer["data"]["result"]

    def scalar(self, expression: str, at: float | None = None) -> float:
        result = self.query(expression, at)
        assert result, f"Prometheus has no value for {expression}"
        return float(result[0]["value"][1])

    def wait_scraped(self, job: str) -> None:
        deadline = time.monotonic() + SCRAPED_TIMEOUT_S
        while not any(r["value"][1] == "1" for r in self.query(f'up{{job="{job}"}}')):
            assert time.monotonic() < deadline, f"Prometheus did not scrape {job}: {self.query('up')}"
            time.sleep(0.5)


@contextlib.contextmanager
def prometheus(targets: dict[str, str], folder: Path):
    """Prometheus scraping targets ({job: metrics URL}) every SCRAPE_S, its data in folder; stopped after."""
    if shutil.which(PROMETHEUS) is None:
        pytest.skip("Debian's prometheus is not installed (.ci/run installs it)")
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "prometheus.yml"
    config.write_text(scrape_config(targets, SCRAPE_S))
    port = free_port()
    log = open(folder / "prometheus.log", "wb")
    process = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
                                f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    server = Prometheus(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert process.poll() is None, (folder / "prometheus.log").read_text()[-2000:]
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{server.url}/-/ready", timeout=2).ok:
                    break
            assert time.monotonic() < deadline, "Prometheus did not start"
            time.sleep(0.5)
        for job in targets:
            server.wait_scraped(job)
        yield server
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def hey_times(url: str, body: Path, content_type: str, seconds: int, concurrency: int) -> list[float]:
    """hey's own per-request times (seconds, sorted) of a load run of `seconds` at `concurrency` (its CSV output:
    Debian's hey leaves the 99% line out of its summary), every answer a 200."""
    done = subprocess.run(["hey", "-z", f"{seconds}s", "-c", str(concurrency), "-m", "POST", "-T", content_type,
                           "-D", str(body), "-o", "csv", url], capture_output=True, text=True, timeout=seconds + 120,
                          check=True)
    rows = [line.split(",") for line in done.stdout.splitlines()[1:] if line.strip()]
    assert rows and all(row[6] == "200" for row in rows), done.stdout[-2000:]
    return sorted(float(row[0]) for row in rows)


def percentile(times: list[float], q: float) -> float:
    return times[math.ceil(q * len(times)) - 1]


def bucket_width(seconds: float) -> float:
    """The width of the latency bucket (handlers/metrics.py) that holds seconds."""
    edges = (0.0, *LATENCY_BUCKETS)
    return next((high - low for low, high in zip(edges, edges[1:]) if seconds <= high), float("inf"))


def quantile_query(q: float, model: str, start: float, end: float,
                   metric: str = "vision_front_request_duration_seconds") -> str:
    """The q-quantile of the requests answered 200 between start and end: the buckets' counts at end less those at
    start (`@`), so that no rate() extrapolates a young series, whose buckets it scales unevenly."""
    buckets = f'{metric}_bucket{{model="{model}",code="200"}}'
    return f"histogram_quantile({q}, sum by (le) ({buckets} @ {end:.3f} - {buckets} @ {start:.3f}))"


def agrees_with_hey(server: Prometheus, url: str, body: Path, content_type: str, model: str,
                    seconds: int = 10, concurrency: int = 2) -> tuple[float, float]:
    """(Prometheus' p99 of what the client waited, hey's p99) of one load run; asserts they agree within the
    bucket's width on every engine (the front's histogram: serving/front.py), and that our request histogram, which
    starts behind the engine's front, is never above it by more than a bucket. Both count exactly the requests
    between a scrape before the run and one after it."""
    time.sleep(2 * SCRAPE_S + 0.5)  # whatever was answered before is in a scrape
    start = time.time()
    times = hey_times(url, body, content_type, seconds, concurrency)
    time.sleep(2 * SCRAPE_S + 0.5)  # the last scrape of the run is in
    end = time.time()
    hey, front = percentile(times, 0.99), server.scalar(quantile_query(0.99, model, start, end), at=end)
    behind = server.scalar(quantile_query(0.99, model, start, end, "vision_request_duration_seconds"), at=end)
    width = max(bucket_width(hey), bucket_width(front))
    said = f"Prometheus p99 at the front {front:.4f} s, behind it {behind:.4f} s, hey's {hey:.4f} s, bucket {width:.4f} s"
    assert abs(front - hey) <= width, said
    assert behind <= front + width, said
    return front, hey


def check_dashboard(server: Prometheus, dashboard: Path, model: str) -> list[str]:
    """Every query of the Grafana dashboard, its $model set, answered by Prometheus with a value."""
    expressions = [target["expr"] for panel in json.loads(dashboard.read_text())["panels"]
                   for target in panel.get("targets", [])]
    assert expressions
    for expression in expressions:
        concrete = expression.replace("$model", model).replace("$__rate_interval", "30s")
        assert server.query(concrete), f"no data for the dashboard's {concrete}"
    return expressions
