"""The serving policy: one function (contract/policy.py resolve_policy) resolves it from the machine, the
archive's pins and the command's flags, with the reason of every value; the handler reads it from the engine's
run config, and resolves it the same way only where no run config names its model (pure functions)."""

import argparse

import pytest
import torch

from contract.errors import VisionExportError
from contract.policy import (
    GPU_BATCH_SIZE,
    MAX_CPU_WORKERS,
    PINNED,
    Machine,
    PolicyChoices,
    PolicyError,
    ServingPolicy,
    add_policy_options,
    resolve_policy,
)
from handlers.image_classifier import select_device
from handlers.policy import (
    RESOLVED_HERE,
    RUN_CONFIG_ENV,
    machine_policy,
    policies_in,
    policies_line,
    this_machine_resources,
    worker_policy,
)


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
    gpus, cores = this_machine_resources()
    assert gpus == 1
    assert machine_policy(gpus, cores).batch_size == GPU_BATCH_SIZE


def test_every_value_says_why_it_is_what_it_is():
    assert resolve_policy(Machine(gpus=0, cores=2)).lines() == [
        "workers 2: one per CPU core, 2 cores", "batch size 1: a CPU gains no throughput from batching",
        "batch delay 5 ms: unused at batch size 1", "threads 1: 2 cores / 2 worker(s)"]
    flagged = resolve_policy(Machine(0, 2), flags=PolicyChoices(threads_per_worker=1))
    assert "threads 1: --threads" in flagged.lines() and flagged.reason.endswith("; threads 1: --threads")


def test_the_archives_pins_win_over_the_flags_which_win_over_the_machine():
    pins = PolicyChoices.pinned_in({"minWorkers": 1, "maxWorkers": 1, "handler": {"threads": 2, "topk": 3}})
    flags = PolicyChoices(workers=3, batch_size=4, threads_per_worker=1)
    policy = resolve_policy(Machine(0, 8), pins, flags)
    assert (policy.workers, policy.batch_size, policy.threads_per_worker) == (1, 4, 2)
    assert policy.reasons == {"workers": PINNED, "batch_size": "--batch-size", "max_batch_delay_ms":
                              "unused at batch size 1", "threads_per_worker": PINNED}
    assert "threads 2: the archive pins it" in policy.lines()


def test_workers_chosen_without_threads_share_the_cores_again():
    """Workers given by a flag or pinned: threads are the cores over those workers, never oversubscribed."""
    assert resolve_policy(Machine(0, 8), flags=PolicyChoices(workers=1)).threads_per_worker == 8
    pinned = resolve_policy(Machine(0, 8), PolicyChoices.pinned_in({"minWorkers": 2}))
    assert pinned.threads_per_worker == 4 and pinned.reasons["threads_per_worker"] == "8 cores / 2 worker(s)"
    assert resolve_policy(Machine(0, 8), flags=PolicyChoices(threads_per_worker=3)).threads_per_worker == 3


def test_a_value_out_of_range_is_refused_in_the_one_family_naming_its_flag_or_pin():
    with pytest.raises(PolicyError, match="--workers must be at least 1, got 0"):
        PolicyChoices(workers=0)
    with pytest.raises(PolicyError, match="--max-batch-delay must be 0 or more, got -1"):
        PolicyChoices(max_batch_delay_ms=-1)
    with pytest.raises(PolicyError, match=r"batchSize \(the archive pins it\) must be at least 1"):
        PolicyChoices.pinned_in({"batchSize": 0})
    with pytest.raises(PolicyError, match="model-config.yaml's minWorkers must be a number"):
        PolicyChoices.pinned_in({"minWorkers": "many"})
    assert issubclass(PolicyError, VisionExportError)


def test_the_flags_are_declared_once_for_every_parser_that_takes_them():
    parser = argparse.ArgumentParser()
    add_policy_options(parser)
    args = parser.parse_args(["--workers", "2", "--batch-size", "4", "--max-batch-delay", "9", "--threads", "3"])
    assert (args.workers, args.batch_size, args.max_batch_delay, args.threads) == (2, 4, 9, 3)
    assert PolicyChoices.from_flags(args) == PolicyChoices(2, 4, 9, 3)
    some = argparse.ArgumentParser()
    add_policy_options(some, ("workers",))
    assert PolicyChoices.from_flags(some.parse_args(["--workers", "2"])) == PolicyChoices(workers=2)
    with pytest.raises(SystemExit):
        some.parse_args(["--threads", "1"])


def test_the_policy_travels_as_it_is():
    policy = resolve_policy(Machine(0, 8), PolicyChoices.pinned_in({"batchSize": 2}), PolicyChoices(workers=2))
    assert ServingPolicy.from_dict(policy.to_dict()) == policy
    assert policy.describe()["why"] == policy.lines()
    hand_made = ServingPolicy(1, 1, 5, 1, "cpu", "a test's own")  # a policy given whole: its reason for every value
    assert hand_made.lines()[0] == "workers 1: a test's own"


def test_the_handler_reads_its_models_policy_from_the_run_config(tmp_path):
    ours = resolve_policy(Machine(0, 2), flags=PolicyChoices(threads_per_worker=2))
    run_config = tmp_path / "config.properties"
    run_config.write_text(f"inference_address=http://127.0.0.1:8080\n{policies_line({'resnet18': ours})}\n")
    assert policies_in(run_config) == {"resnet18": ours}
    policy, source = worker_policy("resnet18", {"minWorkers": 1}, {RUN_CONFIG_ENV: str(run_config)})
    assert policy == ours and str(run_config) in source  # read as it is: the pins were applied where it was resolved


def test_without_a_run_config_naming_the_model_the_handler_resolves_it_the_same_way(tmp_path):
    config = {"minWorkers": 1, "handler": {"threads": 2}}
    expected = resolve_policy(this_machine_resources(), PolicyChoices.pinned_in(config))
    assert worker_policy("resnet18", config, {}) == (expected, RESOLVED_HERE)
    other = tmp_path / "config.properties"
    other.write_text(policies_line({"another": machine_policy(0, 2)}) + "\n")
    assert worker_policy("resnet18", config, {RUN_CONFIG_ENV: str(other)}) == (expected, RESOLVED_HERE)
    assert worker_policy("resnet18", config, {RUN_CONFIG_ENV: str(tmp_path / "gone")}) == (expected, RESOLVED_HERE)


def test_device_comes_from_gpu_id_when_cuda_is_available():
    assert select_device({"gpu_id": 1}, cuda_available=lambda: True) == torch.device("cuda:1")
    assert select_device({"gpu_id": None}, cuda_available=lambda: True) == torch.device("cpu")
    assert select_device({"gpu_id": 0}, cuda_available=lambda: False) == torch.device("cpu")
