"""The Serve config a cluster deploys our archives from (`python -m serving --engine ray serve-config`): accepted
by Ray's own schema (ServeDeploySchema), a misspelled field refused by it, its import_path the very builder the
ray engine deploys, and each deployment's options the serving policy's (replicas, CPUs or GPU,
max_ongoing_requests, autoscaling), the archive's pinned batching winning as on the other engines."""

from __future__ import annotations

import importlib
import zipfile

import pytest
import yaml

pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install '.[ray]' (an optional extra)")
from pydantic import ValidationError  # noqa: E402  (after the skip: Ray Serve brings it)
from ray.serve.deployment import Application  # noqa: E402

from contract.policy import PINNED, Machine, ServingPolicy  # noqa: E402
from handlers.policy import machine_policy  # noqa: E402
from serving.cli import main  # noqa: E402
from serving.ray import serve_config  # noqa: E402
from serving.ray.config import REPLICA_ENV, RaySettings, deployment_options  # noqa: E402

CPU_2_CORES = machine_policy(gpus=0, cores=2)
ONE_GPU = machine_policy(gpus=1, cores=8)


@pytest.fixture
def store(tmp_path):
    """A store of two archives; only their model-config.yaml is read here (one pins TorchServe's batching)."""
    folder = tmp_path / "store"
    folder.mkdir()
    for name, config in (("plain", {}), ("pinned", {"batchSize": 4, "maxBatchDelay": 40})):
        with zipfile.ZipFile(folder / f"{name}.mar", "w") as archive:
            archive.writestr("model-config.yaml", yaml.safe_dump(config))
    return folder


def policies(store, *models: str) -> dict[str, ServingPolicy]:
    """Each model's policy as the ray engine resolves it on a 2-core CPU machine (its archive's pins applied)."""
    return RaySettings(store, models).resolve_policies(Machine(0, 2))


def test_the_config_passes_rays_schema_and_a_wrong_type_does_not(store):
    config = serve_config.serve_config(store, policies(store, "plain", "pinned"), "/mnt/models/model-store")
    assert serve_config.validated(config) is config
    config["applications"][0]["deployments"][0]["max_ongoing_requests"] = "lots"
    with pytest.raises(ValidationError, match="max_ongoing_requests"):
        serve_config.validated(config)


def test_a_misspelled_field_which_rays_schema_ignores_is_refused(store):
    config = serve_config.serve_config(store, policies(store, "plain"))
    config["applications"][0]["deployments"][0]["max_ongoing_request"] = 2
    from ray.serve.schema import ServeDeploySchema
    ServeDeploySchema.model_validate(config)  # Ray's own models drop it silently
    with pytest.raises(ValueError, match=r"applications\[0\]\.deployments\[0\]\.max_ongoing_request"):
        serve_config.validated(config)


def test_each_archive_is_an_application_at_its_route_read_from_the_clusters_store(store):
    config = serve_config.serve_config(store, policies(store, "plain", "pinned"), "/mnt/models/model-store")
    assert [(a["name"], a["route_prefix"]) for a in config["applications"]] == [
        ("plain", "/predictions/plain"), ("pinned", "/predictions/pinned")]
    plain, pinned = (a["args"] for a in config["applications"])
    assert plain["archive"] == "/mnt/models/model-store/plain.mar"
    plain, pinned = ServingPolicy.from_dict(plain["policy"]), ServingPolicy.from_dict(pinned["policy"])
    assert (plain.batch_size, pinned.batch_size, pinned.max_batch_delay_ms) == (1, 4, 40)
    assert pinned.reasons["batch_size"] == PINNED  # the replica reads it as it is, reasons included
    pinned_deployment = config["applications"][1]["deployments"][0]
    assert pinned_deployment["autoscaling_config"]["target_ongoing_requests"] == 4  # the pinned batch


def test_the_import_path_is_the_builder_the_engine_deploys(store):
    config = serve_config.serve_config(store, policies(store, "plain"))
    module, function = config["applications"][0]["import_path"].split(":")
    builder = getattr(importlib.import_module(module), function)
    from serving.ray.deployment import application
    assert builder is application
    assert isinstance(builder(config["applications"][0]["args"]), Application)


@pytest.mark.parametrize("policy,actor,ongoing,replicas", [
    (CPU_2_CORES, {"num_cpus": 1}, 2, (1, 2, 2)),  # a replica per core, one thread each, no batching
    (ONE_GPU, {"num_cpus": 8, "num_gpus": 1}, 16, (1, 1, 1)),  # one batching replica per GPU
])
def test_deployment_options_come_from_the_serving_policy(policy, actor, ongoing, replicas):
    options = deployment_options(policy)
    scaling = options["autoscaling_config"]
    assert options["ray_actor_options"] == {**actor, "runtime_env": {"env_vars": REPLICA_ENV}}
    assert options["max_ongoing_requests"] == ongoing
    assert (scaling["min_replicas"], scaling["initial_replicas"], scaling["max_replicas"]) == replicas
    assert scaling["target_ongoing_requests"] == policy.batch_size


def test_the_autoscaler_paces_for_replicas_that_load_in_seconds_and_ray_accepts_it():
    """Ray's own AutoscalingConfig takes our pace, faster than its defaults in both directions."""
    from ray.serve.config import AutoscalingConfig
    ours = AutoscalingConfig.model_validate(deployment_options(CPU_2_CORES)["autoscaling_config"])
    defaults = AutoscalingConfig()
    assert ours.upscale_delay_s < defaults.upscale_delay_s and ours.downscale_delay_s < defaults.downscale_delay_s
    assert float(REPLICA_ENV["RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S"]) < ours.look_back_period_s
    assert ours.look_back_period_s <= ours.downscale_delay_s


def test_the_command_writes_the_validated_config(store, tmp_path, capsys):
    out = tmp_path / "serve.yaml"
    assert main(["--engine", "ray", "serve-config", "--model-store", str(store), "--models", "plain",
                 "--workers", "3", "--out", str(out)]) == 0
    written = yaml.safe_load(out.read_text())
    assert written["applications"][0]["deployments"][0]["autoscaling_config"]["max_replicas"] == 3
    assert main(["--engine", "ray", "serve-config", "--model-store", str(store)]) == 1
    assert "serve-config needs --out PATH" in capsys.readouterr().err
