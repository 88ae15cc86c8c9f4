"""A worker warms up every batch size it may run on a GPU, where each new shape is tuned and specialised on first
use; on a CPU batch 1 alone (handlers/core.py's warm_up_sizes)."""

from __future__ import annotations

from handlers.core import warm_up_sizes


def test_a_gpu_worker_warms_every_batch_size_its_policy_may_form():
    assert list(warm_up_sizes("cuda:0", 8)) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert list(warm_up_sizes("cuda", 1)) == [1]


def test_a_cpu_worker_warms_batch_1_only():
    assert list(warm_up_sizes("cpu", 8)) == [1]
    assert list(warm_up_sizes("cpu", 1)) == [1]
