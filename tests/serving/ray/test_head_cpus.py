"""Our own Ray head offers a CPU for every replica of every model, not only the largest model's."""

from contract.policy import ServingPolicy
from serving.ray.config import head_cpus


def policy(workers: int, threads: int) -> ServingPolicy:
    return ServingPolicy(workers=workers, batch_size=1, max_batch_delay_ms=5, threads_per_worker=threads,
                         device="cpu", reason="tests")


def test_every_models_replicas_fit_on_our_head():
    assert head_cpus({"a": policy(1, 1), "b": policy(1, 1), "c": policy(1, 1)}, cores=2) == 3
    assert head_cpus({"a": policy(2, 2)}, cores=2) == 4


def test_the_machines_cores_when_the_models_ask_for_fewer():
    assert head_cpus({"a": policy(1, 1)}, cores=8) == 8
