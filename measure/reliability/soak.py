"""Hold a served model under steady load and watch it: `python -m measure soak`.

  python -m measure soak [--model-store model-store] [--model NAME] [--duration 300] [--slice 15] [--concurrency 16]

Starts TorchServe on free loopback ports with the archive (--model, default the store's only archive), waits
until every worker is READY, then drives it with `hey` (measure/loadgen.py) at a fixed concurrency in consecutive slices for the whole duration.
After each slice it reads every worker's resident memory (VmRSS in /proc, pids from the management API).
Prints a table over time, writes soak.md, soak.json and soak.png to --out, and exits non-zero (with the
numbers) when any request failed or went unanswered, a worker was replaced, or a worker's RSS grew by
MAX_RSS_GROWTH or more after the first (warm-up) slice.
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from contract.errors import VisionExportError
from contract.files import atomic_write_text
from measure.command import load_command_parser, load_command_settings, run_load_command
from measure.loadgen import require_hey, run_hey
from measure.reliability.workers import wait_all_ready, workers
from serving.settings import REQUEST_TIMEOUT_S
from serving.torchserve import server
from serving.torchserve.config import ServerSettings

MAX_RSS_GROWTH = 0.10  # memory that keeps growing under steady load is a leak
WARMUP_SLICES = 1  # allocator pools and ORT arenas settle during the first slice


class SoakError(VisionExportError):
    """The server did not hold up under the soak; the message carries the numbers."""


@dataclass
class Slice:
    elapsed_s: float
    requests: int
    req_per_s: float
    p50_ms: float | None
    p99_ms: float | None  # the slowest request when hey printed no 99th percentile (fewer than 100 answers)
    errors: int  # non-200 answers plus requests that got no answer
    rss_mb: dict = field(default_factory=dict)  # worker pid -> resident memory after the slice


def rss_growth(slices: list[Slice]) -> dict[str, float]:
    """Per worker: RSS after the last slice / RSS after warm-up - 1."""
    if len(slices) <= WARMUP_SLICES:
        return {}
    base, last = slices[WARMUP_SLICES - 1].rss_mb, slices[-1].rss_mb
    return {pid: last[pid] / base[pid] - 1 for pid in base if pid in last and base[pid] > 0}


def problems(slices: list[Slice], growth: dict[str, float]) -> list[str]:
    found = []
    errors = sum(s.errors for s in slices)
    if errors:
        found.append(f"{errors} of {sum(s.requests for s in slices)} requests failed or went unanswered")
    pids = [set(s.rss_mb) for s in slices]
    if any(p != pids[0] for p in pids):
        found.append(f"workers were replaced during the soak (pids {[sorted(p) for p in pids]})")
    found += [f"worker {pid} RSS grew {g:.1%} after warm-up (limit {MAX_RSS_GROWTH:.0%})"
              for pid, g in growth.items() if g >= MAX_RSS_GROWTH]
    return found


def table(slices: list[Slice]) -> str:
    lines = ["| elapsed s | requests | req/s | p50 ms | p99 ms¹ | errors | worker RSS MB |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {s.elapsed_s:.0f} | {s.requests} | {s.req_per_s:.1f} | {_ms(s.p50_ms)} | {_ms(s.p99_ms)} | {s.errors} | "
              + ", ".join(f"{pid}: {mb:.0f}" for pid, mb in sorted(s.rss_mb.items())) + " |" for s in slices]
    return "\n".join(lines) + "\n\n¹ the slowest request when a slice had fewer than 100 answers (hey prints no p99 then)"


def _ms(value: float | None) -> str:
    return f"{value:.0f}" if value is not None else "—"


def worker_rss_mb(settings: ServerSettings) -> dict[str, float]:
    """Resident memory of every worker, from /proc (pids from the management API)."""
    rss = {}
    for worker in workers(settings):
        status = Path(f"/proc/{worker['pid']}/status").read_text()
        rss[str(worker["pid"])] = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024
    return rss


def run_slice(settings: ServerSettings, image: Path, seconds: int, concurrency: int) -> dict:
    load = run_hey(settings.predictions_url(), image, concurrency, REQUEST_TIMEOUT_S, duration_s=seconds,
                   headers=server.auth_headers(settings))
    return {"requests": load.requests, "req_per_s": load.req_per_s, "p50_ms": load.p50_ms,
            "p99_ms": load.p99_or_slowest_ms(), "errors": load.failed}


def soak(settings: ServerSettings, image: Path, duration: int, slice_s: int, concurrency: int) -> list[Slice]:
    slices = []
    with server.running(settings, image):
        wait_all_ready(settings, SoakError)
        started = time.monotonic()
        while time.monotonic() - started < duration or not slices:
            numbers = run_slice(settings, image, slice_s, concurrency)
            slices.append(Slice(time.monotonic() - started, rss_mb=worker_rss_mb(settings), **numbers))
            last = slices[-1]
            print(f"  {last.elapsed_s:6.0f} s  {last.req_per_s:7.1f} req/s  p50 {_ms(last.p50_ms):>5} ms  "
                  f"p99 {_ms(last.p99_ms):>5} ms  errors {last.errors}  RSS MB "
                  + " ".join(f"{mb:.0f}" for mb in last.rss_mb.values()), flush=True)
    return slices


def chart(slices: list[Slice], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    times = [s.elapsed_s for s in slices]
    top.plot(times, [s.req_per_s for s in slices], marker="o")
    top.set_ylabel("requests / s")
    for pid in slices[0].rss_mb:
        bottom.plot(times, [s.rss_mb.get(pid, float("nan")) for s in slices], marker="o", label=f"worker {pid}")
    bottom.set_ylabel("RSS MB")
    top.set_ylim(0, max(s.req_per_s for s in slices) * 1.15)  # from zero: a drift looks as large as it is
    bottom.set_ylim(0, max(max(s.rss_mb.values(), default=1) for s in slices) * 1.15)
    bottom.set_xlabel("seconds")
    bottom.legend()
    top.set_title("Soak: throughput and worker memory over time (one run)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    return run_load_command(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    parser = load_command_parser("soak", __doc__, out="soak-results")
    parser.add_argument("--duration", type=int, default=300, help="seconds of load (default 300)")
    parser.add_argument("--slice", type=int, default=15, help="seconds per measured slice (default 15)")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    if min(args.duration, args.slice, args.concurrency) < 1:
        raise SoakError("--duration, --slice and --concurrency must be at least 1")
    require_hey()
    settings = load_command_settings(args)
    print(f"soak of {settings.model_name}: {args.duration} s at concurrency {args.concurrency}, slices of {args.slice} s", flush=True)
    slices = soak(settings, args.image, args.duration, args.slice, args.concurrency)
    growth = rss_growth(slices)
    found = problems(slices, growth)
    summary = {"slices": [asdict(s) for s in slices], "rss_growth_after_warmup": growth, "problems": found,
               "model": settings.model_name, "concurrency": args.concurrency, "duration_s": args.duration}
    atomic_write_text(args.out / "soak.json", json.dumps(summary, indent=2))
    growth_line = ", ".join(f"worker {pid}: {g:+.2%}" for pid, g in growth.items()) or "n/a (one slice)"
    atomic_write_text(args.out / "soak.md", f"# Soak of {settings.model_name} at concurrency {args.concurrency}\n\n{table(slices)}\n\n"
                                             f"RSS growth after warm-up: {growth_line}\n")
    chart(slices, args.out / "soak.png")
    print(f"\n{table(slices)}\n\nRSS growth after warm-up: {growth_line}\nwrote {args.out}/soak.md, soak.json, soak.png")
    if found:
        raise SoakError("; ".join(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
