"""Running a backend over image batches and timing it at batch 1: what the gate and the variants' speed use."""

from __future__ import annotations

import statistics

import torch

from export.precision.gate import GATE_BATCH
from runtime.base import Backend
from runtime.timing import time_runs

SPEED_WARMUP = 2
SPEED_RUNS = 10  # batch-1 images/s, median of single calls: enough to tell the activation types apart


def run_batches(backend: Backend, images: torch.Tensor, batch: int = GATE_BATCH) -> torch.Tensor:
    return torch.cat([backend(images[i:i + batch]) for i in range(0, len(images), batch)])


def images_per_s(backend: Backend, example: torch.Tensor) -> float:
    """Batch-1 images/s, median of single calls after a warm-up: recorded in the ladder, and chooses int8's
    activation type (the served artifact itself is chosen by the declared rule, never by timing)."""
    milliseconds = time_runs(lambda: backend(example), SPEED_WARMUP, SPEED_RUNS, min_seconds=0)
    return round(example.shape[0] * 1000 / statistics.median(milliseconds), 1)
