"""The Serve config a Ray cluster deploys our archives from (`serve deploy CONFIG`, or a KubeRay RayService's
`serveConfigV2`): `python -m serving --engine ray serve-config --out serve.yaml`. One application per archive,
the same builder the ray engine deploys (serving/ray/deployment.py application), each deployment's options
from its model's serving policy, resolved on this machine (config.py deployment_options), where operators tune
them. The archives'
path is the one every node reads (--cluster-model-store: the image's or a shared volume's). Validated against
Ray's own schema (ray.serve.schema.ServeDeploySchema) before it is written."""

from __future__ import annotations

from pathlib import Path

import yaml

from contract.policy import ServingPolicy
from contract.versions import archive_name
from serving.ray.config import HTTP_PORT, deployment_options
from serving.ray.deployment import application_args
from serving.settings import archive_version

IMPORT_PATH = "serving.ray.deployment:application"
CLUSTER_HOST = "0.0.0.0"  # in a cluster the proxies serve the pod's or node's address; the network guards them
# Every node runs a proxy: a load balancer (a Kubernetes Service) in front of them reaches any node.
CLUSTER_PROXY_LOCATION = "EveryNode"


def serve_config(model_store: Path, policies: dict[str, ServingPolicy],
                 cluster_model_store: Path | None = None) -> dict:
    """The Serve config (ServeDeploySchema) for the models of model_store, each under its resolved policy
    ({name: policy}), read on the cluster's nodes from cluster_model_store (default: model_store's absolute
    path)."""
    where = Path(cluster_model_store) if cluster_model_store else Path(model_store).absolute()
    applications = []
    for name, policy in policies.items():
        args = application_args(where / versioned_name(Path(model_store), name), policy)
        applications.append({"name": name, "route_prefix": f"/predictions/{name}", "import_path": IMPORT_PATH,
                             "args": args, "deployments": [{"name": name, **deployment_options(policy)}]})
    return {"proxy_location": CLUSTER_PROXY_LOCATION, "http_options": {"host": CLUSTER_HOST, "port": HTTP_PORT},
            "applications": applications}


def versioned_name(model_store: Path, name: str) -> str:
    """NAME.vN.mar for the version NAME.mar is (each version its own path: a cluster that is given the next one
    updates its application in place), NAME.mar for an archive made before versions."""
    version = archive_version(model_store / f"{name}.mar")
    return archive_name(name, version.number) if version else f"{name}.mar"


def validated(config: dict) -> dict:
    """config, once Ray's own schema accepted it (a ValidationError names what it refused) and every field it
    holds is one of the schema's: Ray's models ignore a field they do not know, so a misspelled one would be
    dropped without a word (ValueError naming it)."""
    from ray.serve.schema import DeploymentSchema, ServeApplicationSchema, ServeDeploySchema
    ServeDeploySchema.model_validate(config)
    unknown = unknown_fields(config, ServeDeploySchema, "")
    for index, app in enumerate(config.get("applications", [])):
        unknown += unknown_fields(app, ServeApplicationSchema, f"applications[{index}].")
        for number, deployment in enumerate(app.get("deployments", [])):
            unknown += unknown_fields(deployment, DeploymentSchema, f"applications[{index}].deployments[{number}].")
    if unknown:
        raise ValueError(f"not fields of Ray's Serve config schema: {', '.join(unknown)}")
    return config


def unknown_fields(record: dict, schema, where: str) -> list[str]:
    known = set(schema.model_fields) | {field.alias for field in schema.model_fields.values() if field.alias}
    return [f"{where}{key}" for key in record if key not in known]


def write(path: Path, config: dict) -> None:
    from contract.files import atomic_write_text
    atomic_write_text(path, "# Ray Serve config: serve deploy THIS, or a RayService's serveConfigV2 (docs/scaling.md)\n"
                      + yaml.safe_dump(validated(config), sort_keys=False))
