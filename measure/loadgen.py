"""The one load generator runner: `hey` (a real load generator, from apt) and the one reader of its summary.

Every measurement here (benchmark, soak, GPU check) drives TorchServe through `run_hey`. Where hey is not
installed and a bounded number of requests is enough (the GPU check on a bare machine), `run_pool` sends
them from a thread pool with urllib and reports the same Load. Standard library and the error root only: the
GPU check imports this on machines without the project's virtual environment (in its serving step).
"""

from __future__ import annotations

import concurrent.futures
import mimetypes
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from contract.errors import VisionExportError

HEY = "hey"
HEY_MISSING = "the load generator `hey` is not installed: apt-get install hey"
SPAWN_MARGIN_S = 60  # on top of the load's own length, before a hung hey is stopped
CONTENT_TYPE = "image/jpeg"  # when a body's file name says nothing else


def content_type(body: Path) -> str:
    """The Content-Type a client sends with this file (image/png for a PNG); image/jpeg when unknown."""
    guessed, _ = mimetypes.guess_type(str(body))
    return guessed if guessed and guessed.startswith("image/") else CONTENT_TYPE


class LoadError(VisionExportError):
    """The load generator is missing, failed or hung; the message says which and what to do."""


@dataclass
class Load:
    """One run of the load generator."""
    requests: int  # answered (any status) plus requests that got no answer
    req_per_s: float
    p50_ms: float | None  # None: hey prints a percentile only when there are enough answers (p99: >= 100)
    p90_ms: float | None
    p99_ms: float | None
    slowest_ms: float | None
    failed: int  # non-200 answers plus requests that got no answer
    tool: str = HEY

    def p99_or_slowest_ms(self) -> float | None:
        """p99, or the slowest request (an upper bound) when there were too few answers for hey to print it."""
        return self.p99_ms if self.p99_ms is not None else self.slowest_ms


def hey_available() -> bool:
    return shutil.which(HEY) is not None


def require_hey() -> None:
    if not hey_available():
        raise LoadError(HEY_MISSING)


def parse_hey(output: str) -> Load:
    """Requests/s, latency percentiles, the slowest request and every failure from hey's summary."""
    def ms(pattern: str) -> float | None:
        match = re.search(pattern, output)
        return float(match.group(1)) * 1000 if match else None

    rate = re.search(r"Requests/sec:\s+([\d.]+)", output)
    statuses = {int(code): int(count) for code, count in re.findall(r"\[(\d{3})\]\s+(\d+) responses", output)}
    errors_section = output.split("Error distribution:", 1)[1] if "Error distribution:" in output else ""
    unanswered = sum(int(n) for n in re.findall(r"^\s+\[(\d+)\]", errors_section, re.MULTILINE))
    return Load(requests=sum(statuses.values()) + unanswered, req_per_s=float(rate.group(1)) if rate else 0.0,
                p50_ms=ms(r"50%\s+in\s+([\d.]+)\s+secs"), p90_ms=ms(r"90%\s+in\s+([\d.]+)\s+secs"),
                p99_ms=ms(r"99%\s+in\s+([\d.]+)\s+secs"), slowest_ms=ms(r"Slowest:\s+([\d.]+)\s+secs"),
                failed=sum(n for code, n in statuses.items() if code != 200) + unanswered)


def hey_command(url: str, image: Path, concurrency: int, request_timeout_s: float, duration_s: int | None = None,
                requests: int | None = None, headers: dict | None = None, mime: str | None = None) -> list[str]:
    """POST the image for duration_s seconds, or exactly `requests` times, with Content-Type `mime` (default:
    content_type(image))."""
    if (duration_s is None) == (requests is None):
        raise ValueError("give either duration_s or requests")
    command = [HEY, "-c", str(concurrency), "-t", str(int(request_timeout_s)), "-m", "POST",
               "-T", mime or content_type(Path(image)), "-D", str(image)]
    command += ["-z", f"{duration_s}s"] if requests is None else ["-n", str(requests)]
    command += [part for name, value in (headers or {}).items() for part in ("-H", f"{name}: {value}")]
    return command + [url]


def run_hey(url: str, image: Path, concurrency: int, request_timeout_s: float, duration_s: int | None = None,
            requests: int | None = None, headers: dict | None = None, limit_s: float | None = None,
            mime: str | None = None) -> Load:
    """Run hey to the end and read its summary; limit_s bounds the whole run (default: the load's own
    length plus a request timeout and SPAWN_MARGIN_S)."""
    require_hey()
    command = hey_command(url, image, concurrency, request_timeout_s, duration_s, requests, headers, mime)
    bound = limit_s or (duration_s or 0) + request_timeout_s * (1 + (requests or 0)) + SPAWN_MARGIN_S
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=bound)
    except subprocess.TimeoutExpired:
        raise LoadError(f"hey did not finish within {bound:.0f} s ({' '.join(command[:-1])} ...)") from None
    if done.returncode != 0:
        raise LoadError(f"hey exited with {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}")
    return parse_hey(done.stdout)


def run_pool(url: str, image: Path, concurrency: int, requests: int, request_timeout_s: float, limit_s: float,
             headers: dict | None = None) -> Load:
    """`requests` POSTs from `concurrency` threads (urllib); requests not started within limit_s are not sent."""
    body, deadline = Path(image).read_bytes(), time.monotonic() + limit_s
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = [r for r in pool.map(lambda _: post_once(url, body, deadline, request_timeout_s, headers),
                                       range(requests)) if r]
    elapsed = time.perf_counter() - started
    latencies = [ms for ms, _ in results]
    return Load(len(results), len(results) / elapsed, percentile(latencies, 50), percentile(latencies, 90),
                percentile(latencies, 99), max(latencies, default=None), sum(not ok for _, ok in results),
                "thread pool (urllib)")


def post_once(url: str, body: bytes, deadline: float, request_timeout_s: float,
              headers: dict | None = None) -> tuple[float, bool] | None:
    """(milliseconds, answered 200) for one POST, or None when the deadline has passed before it started."""
    if time.monotonic() > deadline:
        return None
    request = urllib.request.Request(url, data=body, headers={"Content-Type": CONTENT_TYPE, **(headers or {})},
                                     method="POST")
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=request_timeout_s) as response:
            response.read()
            ok = response.status == 200
    except (urllib.error.URLError, TimeoutError, ConnectionError):  # counted as a failed request, as hey does
        ok = False
    return (time.perf_counter() - start) * 1000, ok


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile; None when nothing was measured."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]
