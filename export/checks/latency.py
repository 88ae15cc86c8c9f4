"""A short in-process latency per form, at the serving policy's thread setting on this machine: what the export's
table and report.html show beside size and parity. Bounded (about BUDGET_S of timed calls per form after one
warm-up call) and for information only: the served form is chosen by rule, and `--no-benchmark` skips it."""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from contract.policy import Machine, resolve_policy
from contract.records import Manifest
from runtime import RunOptions, open_artifact
from runtime.base import ArtifactError
from runtime.timing import time_runs

BUDGET_S = 0.5  # of timed calls per form (one warm-up call before them; at least one timed call)
MAX_CALLS = 50


@dataclass
class Latency:
    """Median milliseconds of one call on the example input, per form; why a form has none; what it cost."""

    threads: int
    reason: str  # where the thread count comes from (the serving policy's words)
    median_ms: dict[str, float] = field(default_factory=dict)
    not_measured: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0  # what measuring added to the export

    def as_dict(self) -> dict:
        return {
            "threads": self.threads,
            "reason": self.reason,
            "median_ms": self.median_ms,
            "not_measured": self.not_measured,
            "seconds": round(self.seconds, 1),
        }


def serving_threads() -> tuple[int, str]:
    """The threads one worker runs with under the serving policy this machine gets when nothing is pinned."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    policy = resolve_policy(Machine(gpus, cores))
    return policy.threads_per_worker, policy.reasons.get("threads_per_worker", policy.reason)


def measure_forms(folder: Path, manifest: Manifest, example: torch.Tensor, device: str = "cpu") -> Latency:
    """Each artifact of the export opened anew with the policy's threads and timed on the example input."""
    threads, reason = serving_threads()
    found = Latency(threads, reason)
    started, torch_threads = time.perf_counter(), torch.get_num_threads()
    try:
        for kind, record in manifest.artifacts.items():
            try:
                backend = open_artifact(
                    record.format,
                    folder / record.path,
                    RunOptions(device=device, threads=threads, precision=record.run_precision),
                    name=kind,
                )
                times = time_runs(
                    lambda backend=backend: backend(example), 1, 1, min_seconds=BUDGET_S, max_runs=MAX_CALLS
                )
            except ArtifactError as error:  # a form that cannot open or run the example here: said, not timed
                found.not_measured[kind] = str(error).splitlines()[0][:200]
                continue
            found.median_ms[kind] = round(statistics.median(times), 3)
    finally:
        torch.set_num_threads(torch_threads)  # a TorchScript backend sets the process's threads
    found.seconds = time.perf_counter() - started
    return found


def skipped() -> Latency:
    """--no-benchmark: nothing measured, and the table says why."""
    threads, reason = serving_threads()
    return Latency(threads, reason, not_measured={"*": "--no-benchmark"})
