"""Serving policy decided where the model is served; device and threads in the handler (pure functions)."""

import torch

from handlers.core import worker_threads
from handlers.image_classifier import offered_threads, select_device
from handlers.policy import GPU_BATCH_SIZE, MAX_CPU_WORKERS, THREADS_ENV, machine_policy, this_machine, with_overrides


def test_gpu_host_gets_one_batching_worker_per_gpu():
    policy = machine_policy(gpus=2, cores=16)
    assert (policy.workers, policy.batch_size, policy.device) == (2, GPU_BATCH_SIZE, "gpu")
    assert policy.model_config() == {"minWorkers": 2, "maxWorkers": 2, "batchSize": 8, "maxBatchDelay": 50}


def test_cpu_host_gets_a_worker_per_core_without_batching_and_never_oversubscribes():
    for cores in (1, 2, 3, 4, 8, 64):
        policy = machine_policy(gpus=0, cores=cores)
        assert policy.workers == min(cores, MAX_CPU_WORKERS) and policy.batch_size == 1
        assert policy.workers * policy.threads_per_worker <= cores
    assert machine_policy(0, 8).threads_per_worker == 2  # 4 workers x 2 threads, not "one thread each"


def test_the_gpu_policy_is_chosen_when_cuda_is_there(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    gpus, cores = this_machine()
    assert gpus == 1
    assert machine_policy(gpus, cores).batch_size == GPU_BATCH_SIZE


def test_overrides_win_and_rederive_threads():
    base = machine_policy(0, 8)
    pinned = with_overrides(base, workers=1, cores=8)
    assert pinned.workers == 1 and pinned.threads_per_worker == 8 and "overridden: workers=1" in pinned.reason
    assert with_overrides(base, threads=3).threads_per_worker == 3
    assert with_overrides(base) is base


def test_worker_threads_archive_pin_then_what_the_engine_offers_then_machine():
    assert worker_threads(3, 2) == 3
    assert worker_threads(None, 2) == 2
    assert worker_threads(None, None) == machine_policy(*this_machine()).threads_per_worker


def test_torchserve_offers_the_thread_count_python_m_serving_decided():
    assert offered_threads({THREADS_ENV: "2"}) == 2
    assert offered_threads({}) is None


def test_device_comes_from_gpu_id_when_cuda_is_available():
    assert select_device({"gpu_id": 1}, cuda_available=lambda: True) == torch.device("cuda:1")
    assert select_device({"gpu_id": None}, cuda_available=lambda: True) == torch.device("cpu")
    assert select_device({"gpu_id": 0}, cuda_available=lambda: False) == torch.device("cpu")
