"""The serving policy, decided on the machine that serves (not the one that exported).

GPU: one worker per GPU, batches of up to GPU_BATCH_SIZE within GPU_BATCH_DELAY_MS keep the device busy.
CPU: batching gains no throughput on a CPU (a batch costs what its rows cost one by one) and its delay adds
latency, while a worker per core overlaps one request's decoding with another's inference (measured with
`python -m measure bench`: docs/benchmarks.md). Workers are capped at MAX_CPU_WORKERS so a
many-core host does not load dozens of copies; threads per worker = cores // workers, so workers x
threads never exceeds the cores (TorchServe's defaults oversubscribe and throughput collapses).

`python -m serving` writes the policy into TorchServe's config (per-model `models=` settings) and tells
the handler its thread count through THREADS_ENV; anything pinned at export time (--workers ...) or
given to `python -m serving` overrides it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

GPU_BATCH_SIZE = 8
GPU_BATCH_DELAY_MS = 50
CPU_BATCH_DELAY_MS = 5  # unused at batch size 1; TorchServe wants a value
MAX_CPU_WORKERS = 4
THREADS_ENV = "VISION_EXPORT_THREADS"  # set by `python -m serving` for the handler in each worker


@dataclass(frozen=True)
class ServingPolicy:
    workers: int
    batch_size: int
    max_batch_delay_ms: int
    threads_per_worker: int  # CPU threads of torch / ONNX Runtime in each worker (GPU: host-side threads)
    device: str  # "gpu" or "cpu": what the machine offered
    reason: str

    def model_config(self) -> dict:
        """TorchServe's per-model keys."""
        return {"minWorkers": self.workers, "maxWorkers": self.workers, "batchSize": self.batch_size,
                "maxBatchDelay": self.max_batch_delay_ms}


def machine_policy(gpus: int, cores: int) -> ServingPolicy:
    cores = max(1, cores)
    if gpus > 0:
        return ServingPolicy(gpus, GPU_BATCH_SIZE, GPU_BATCH_DELAY_MS, max(1, cores // gpus), "gpu",
                             f"{gpus} GPU(s): one batching worker per GPU")
    workers = min(cores, MAX_CPU_WORKERS)
    return ServingPolicy(workers, 1, CPU_BATCH_DELAY_MS, max(1, cores // workers), "cpu",
                         f"CPU only, {cores} cores: a worker per core (at most {MAX_CPU_WORKERS}), no batching")


def this_machine() -> tuple[int, int]:
    """(GPUs that CUDA can use here, CPU cores available to this process)."""
    import torch
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return gpus, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def with_overrides(policy: ServingPolicy, workers: int | None = None, batch_size: int | None = None,
                   max_batch_delay_ms: int | None = None, threads: int | None = None,
                   cores: int | None = None) -> ServingPolicy:
    """Explicit choices win; changing the workers re-derives threads so workers x threads <= cores."""
    changes = {k: v for k, v in {"workers": workers, "batch_size": batch_size,
                                  "max_batch_delay_ms": max_batch_delay_ms}.items() if v is not None}
    if workers is not None and threads is None and cores:
        changes["threads_per_worker"] = max(1, cores // workers)
    if threads is not None:
        changes["threads_per_worker"] = threads
    if not changes:
        return policy
    return replace(policy, **changes, reason=policy.reason + "; overridden: " +
                   ", ".join(f"{k}={v}" for k, v in changes.items()))
