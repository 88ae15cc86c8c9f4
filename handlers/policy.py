"""The serving policy of this worker, resolved by contract/policy.py's one function (resolve_policy): as
`python -m serving` resolved it and wrote it in the engine's run config, read as it is; or, where no run config
names the model (an archive served by a TorchServe we did not start), resolved here from this machine and the
archive's pins, by the same function.

TorchServe's workers find the run config (its config.properties, whose POLICIES_PROPERTY line holds each model's
policy) through RUN_CONFIG_ENV, which `python -m serving` sets for them; the KServe and Ray server processes read
their settings file and hand each model its policy.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from contract.policy import Machine, PolicyChoices, ServingPolicy, resolve_policy
from runtime.machine import cuda_gpus

logger = logging.getLogger(__name__)

RUN_CONFIG_ENV = "VISION_EXPORT_RUN_CONFIG"  # the run config's path, for TorchServe's workers
POLICIES_PROPERTY = "vision_export_policies"  # config.properties: {model: its policy} as JSON, for the handler
RESOLVED_HERE = "this worker's own resolution (no run config names this model)"


def this_machine_resources() -> Machine:
    """(GPUs that CUDA can use here, CPU cores available to this process), without importing torch."""
    return Machine(cuda_gpus(), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def machine_policy(gpus: int, cores: int) -> ServingPolicy:
    """What a machine gives when nothing is pinned or chosen (resolve_policy's own)."""
    return resolve_policy(Machine(gpus, cores))


def policies_line(policies: dict[str, ServingPolicy]) -> str:
    """The run config's line that holds every model's policy (TorchServe's config.properties)."""
    return f"{POLICIES_PROPERTY}={json.dumps({name: policy.to_dict() for name, policy in policies.items()})}"


def policies_in(run_config: Path) -> dict[str, ServingPolicy]:
    """Every model's policy as the run config holds it ({} when it holds none)."""
    prefix = f"{POLICIES_PROPERTY}="
    for line in Path(run_config).read_text().splitlines():
        if line.startswith(prefix):
            return {name: ServingPolicy.from_dict(data) for name, data in json.loads(line[len(prefix):]).items()}
    return {}


def worker_policy(model: str, model_config: dict | None, environ: dict | None = None) -> tuple[ServingPolicy, str]:
    """(this model's policy, where it comes from): the run config RUN_CONFIG_ENV names, or resolved here from this
    machine and the archive's pins (model_config: its model-config.yaml) when no run config names the model."""
    path = (os.environ if environ is None else environ).get(RUN_CONFIG_ENV)
    policy = policies_in(Path(path)).get(model) if path and Path(path).is_file() else None
    if policy is not None:
        return policy, f"the run config {path}"
    return resolve_policy(this_machine_resources(), PolicyChoices.pinned_in(model_config)), RESOLVED_HERE
