"""The one timing loop: every measurement (the in-process benchmark, AOTInductor tuning, the request path, the
export's information-only latency, the int8 fallback's speed check) times a call through it."""

from __future__ import annotations

import time
from typing import Callable

MIN_TIMED_S = 1.0  # small batches run more than REPEATS times, so a median is not of a few milliseconds
MAX_RUNS = 50


def time_runs(run: Callable[[], object], warmup: int, repeats: int, min_seconds: float = MIN_TIMED_S,
              max_runs: int = MAX_RUNS, synchronize: Callable[[], None] = lambda: None) -> list[float]:
    """ms of each timed run after `warmup` untimed ones: at least `repeats` runs and `min_seconds` in all."""
    for _ in range(warmup):
        run()
    synchronize()
    times: list[float] = []
    while len(times) < repeats or (sum(times) < min_seconds * 1000 and len(times) < max_runs):
        start = time.perf_counter()
        run()
        synchronize()
        times.append((time.perf_counter() - start) * 1000)
    return times
