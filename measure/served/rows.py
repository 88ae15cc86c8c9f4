"""One served configuration, loaded with hey: a row per body and concurrency, and a `mix` row.

hey sends one body per process. The mix row runs one hey per body at the same time, for the same duration,
with the concurrency split between them (8 clients over 4 bodies: 2 each; a remainder goes to the first
bodies; measured only where there are at least as many clients as bodies, and only with --duration: a fixed
--requests count would end the processes at different times). Its requests, errors and req/s are the sums of
the processes' (exact: every hey runs the same window). Its p50/p90/p99 are the largest of the
processes' percentiles, an upper bound of the merged distribution's (at most q % of each body's requests are
slower than its own q-th percentile, so at most q % of all are slower than the largest): the table marks them
with `<=`. `bodies` records how many requests each body had, so the mix's pipeline ceiling is taken for the
same composition.
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from measure.loadgen import Load, content_type, run_hey
from measure.served import report

MIX = report.MIX
WARMUP_REQUESTS_PER_CLIENT = 1  # per body, at the largest concurrency, before the measured rows
# ... after warmup_s of the first body: a server is measured in its steady state. TorchServe's frontend JIT-compiles
# its request path over the first thousands of requests (what that costs a cold server: docs/results/2026-11-25-serving-overhead/analysis.md)
DEFAULT_WARMUP_S = 20
LOG_FLUSH_S = 1.0  # the frontend copies worker stdout into model_log.log asynchronously


@dataclass
class Served:
    """A running server as the load generator sees it."""
    name: str  # the configuration
    url: str
    timeout_s: float  # a request may take as long as the server lets a worker take
    wire: dict  # {body name: (file hey sends, its Content-Type)}
    headers: dict = field(default_factory=dict)
    model_log: Path | None = None  # where our handler logs its stage times (None: it logs none)
    facts: dict = field(default_factory=dict)  # model, precision, artifact, gate: copied into each row
    pid: int | None = None  # the server's first process: its tree's CPU time is counted per row (None: not counted)


@dataclass(frozen=True)
class LoadPlan:
    duration_s: int | None  # seconds per row, or
    requests: int | None  # a fixed count per row
    warmup_s: int = DEFAULT_WARMUP_S  # of the first body at the largest concurrency, before any row (0: none)


def raw_wire(files: list[Path]) -> dict:
    """Each body as itself with its own Content-Type (image/png for a PNG): what TorchServe rows are sent."""
    return {path.name: (path, content_type(path)) for path in files}


def split(concurrency: int, parts: int) -> list[int]:
    """concurrency spread over parts as evenly as integers go (8 over 3: 3, 3, 2)."""
    return [concurrency // parts + (i < concurrency % parts) for i in range(parts)]


def hey_load(served: Served, body: str, concurrency: int, plan: LoadPlan) -> Load:
    file, mime = served.wire[body]
    return run_hey(served.url, file, concurrency, served.timeout_s, plan.duration_s, plan.requests, served.headers,
                   mime=mime)


def merged(loads: dict[str, Load]) -> tuple[Load, dict]:
    """The mix's Load from its processes' (sums; percentiles: their largest, an upper bound)."""
    def largest(values):
        present = [v for v in values if v is not None]
        return max(present) if present else None

    parts = list(loads.values())
    load = Load(sum(p.requests for p in parts), sum(p.req_per_s for p in parts),
                largest(p.p50_ms for p in parts), largest(p.p90_ms for p in parts), largest(p.p99_ms for p in parts),
                largest(p.slowest_ms for p in parts), sum(p.failed for p in parts))
    return load, {body: p.requests for body, p in loads.items()}


def mix_load(served: Served, concurrency: int, plan: LoadPlan) -> tuple[Load, dict]:
    bodies = list(served.wire)
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        futures = {body: pool.submit(hey_load, served, body, share, plan)
                   for body, share in zip(bodies, split(concurrency, len(bodies)))}
        return merged({body: future.result() for body, future in futures.items()})


def warm(served: Served, concurrency: int, seconds: int) -> None:
    bodies = list(served.wire)
    if seconds:
        hey_load(served, bodies[0], concurrency, LoadPlan(seconds, None))
    for body in bodies:
        hey_load(served, body, concurrency, LoadPlan(None, WARMUP_REQUESTS_PER_CLIENT * concurrency))


def stage_window(served: Served, measure):
    """measure() with the handler's stage medians of the requests it sent (from model_log.log)."""
    if served.model_log is None:
        return measure(), {}
    time.sleep(LOG_FLUSH_S)
    offset = served.model_log.stat().st_size if served.model_log.exists() else 0
    result = measure()
    time.sleep(LOG_FLUSH_S)
    text = ""
    if served.model_log.exists():
        with open(served.model_log, "rb") as handle:
            handle.seek(offset)
            text = handle.read().decode(errors="replace")
    return result, report.stage_medians(report.parse_stage_lines(text))


def tree_cpu_s(pid: int | None) -> dict[int, float]:
    """CPU seconds (user + system) so far of each process of the tree rooted at pid: the frontend, its workers."""
    if pid is None:
        return {}
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    seconds = {}
    for process in processes:
        try:
            times = process.cpu_times()
            seconds[process.pid] = times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return seconds


def cpu_window(served: Served, measure):
    """measure() with the server's CPU seconds during it (processes alive at both ends: the window's workers)."""
    before = tree_cpu_s(served.pid)
    result = measure()
    after = tree_cpu_s(served.pid)
    return result, (sum(after[p] - before[p] for p in after if p in before) if before else None)


def row(served: Served, body: str, concurrency: int, plan: LoadPlan) -> dict:
    if body == MIX:
        ((load, composition), cpu_s), stages = stage_window(
            served, lambda: cpu_window(served, lambda: mix_load(served, concurrency, plan)))
    else:
        (load, cpu_s), stages = stage_window(
            served, lambda: cpu_window(served, lambda: hey_load(served, body, concurrency, plan)))
        composition = {body: load.requests}
    measured = {"configuration": served.name, "body": body, **served.facts, "concurrency": concurrency,
                "duration_s": plan.duration_s, "requests": load.requests, "req_per_s": load.req_per_s,
                "p50_ms": load.p50_ms, "p90_ms": load.p90_ms, "p99_ms": load.p99_ms, "slowest_ms": load.slowest_ms,
                "failed": load.failed,
                "server_cpu_ms": cpu_s * 1000 / load.requests if cpu_s is not None and load.requests else None,
                "stages_ms": stages, "bodies": composition}
    print(report.progress_line(f"{served.name} {body}", measured), flush=True)
    return measured


def bodies_at(served: Served, concurrency: int, plan: LoadPlan) -> list[str]:
    """Each body, then the mix where there are several bodies, a client for each and a duration to share."""
    names = list(served.wire)
    return names + ([MIX] if 1 < len(names) <= concurrency and plan.duration_s else [])


def load_rows(served: Served, levels: list[int], plan: LoadPlan) -> list[dict]:
    warm(served, max(levels), plan.warmup_s)
    return [row(served, body, level, plan) for level in levels for body in bodies_at(served, level, plan)]
