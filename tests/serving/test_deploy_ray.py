"""`python -m serving deploy ray OUT`: a KubeRay RayService, validated against the CRD schema KubeRay v1.7.0 publishes
(jsonschema, and every field known to it: the API server would prune an unknown one without a word), its
serveConfigV2 against Ray's own Serve schema (serving.ray.serve_config.validated), its claim and upload pod with
kubernetes-validate; the pods' resources from the serving policy, the image's Ray the installed one. No cluster runs
here: what KubeRay does with it is not tested."""

from __future__ import annotations

import copy
import dataclasses
import gzip
import re
import tomllib
import zipfile

import pytest
import yaml

pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install '.[ray]' (an optional extra)")
import jsonschema
import ray

from contract.policy import Machine, PolicyChoices, resolve_policy
from handlers.policy import machine_policy
from serving.cli import main
from serving.deploy import ray as deploy_ray
from serving.deploy.common import MAX_REPLICAS, RESOURCES
from serving.ray.config import HTTP_PORT, deployment_options
from serving.ray.serve_config import validated
from tests.conftest import ROOT
from tests.docker.test_dockerfile import DOCKERFILE, install_commands, parse_stages, run_script
from tests.serving.manifests import manifest
from tests.serving.schemas import validate_kubernetes

CRD = ROOT / "tests" / "data" / "kuberay" / "ray.io_rayservices-v1.7.0.yaml.gz"
CPU_2_CORES = machine_policy(gpus=0, cores=2)
ONE_GPU = machine_policy(gpus=1, cores=8)
THREE_BY_TWO = resolve_policy(Machine(0, 2), flags=PolicyChoices(workers=3, threads_per_worker=2))


@pytest.fixture(scope="module")
def schema() -> dict:
    crd = yaml.safe_load(gzip.decompress(CRD.read_bytes()))
    assert crd["spec"]["names"]["kind"] == "RayService"
    (v1,) = [version for version in crd["spec"]["versions"] if version["name"] == "v1"]
    return v1["schema"]["openAPIV3Schema"]


def without_kubernetes_keys(node):
    """The schema less its x-kubernetes-* keys: annotations for the API server, not JSON Schema keywords."""
    if isinstance(node, dict):
        return {k: without_kubernetes_keys(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if isinstance(node, list):
        return [without_kubernetes_keys(item) for item in node]
    return node


def unknown_fields(document, schema: dict, where: str = "$") -> list[str]:
    """Fields the schema does not name. A CRD's structural schema sets no additionalProperties: false; the API
    server prunes what it does not know instead, so a misspelled field would vanish silently."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found = []
    if isinstance(document, dict) and "properties" in schema:
        for key, value in document.items():
            if key not in schema["properties"]:
                found.append(f"{where}.{key}")
            else:
                found += unknown_fields(value, schema["properties"][key], f"{where}.{key}")
    elif isinstance(document, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, value in document.items():
            found += unknown_fields(value, schema["additionalProperties"], f"{where}.{key}")
    elif isinstance(document, list) and "items" in schema:
        for index, item in enumerate(document):
            found += unknown_fields(item, schema["items"], f"{where}[{index}]")
    return found


def validate_ray_service(document: dict, schema: dict) -> None:
    """As the API server with KubeRay v1.7.0's CRD would: types, enums, required fields; and no unknown field."""
    validator = jsonschema.Draft7Validator(without_kubernetes_keys(schema))
    errors = sorted(validator.iter_errors(document), key=lambda error: list(error.absolute_path))
    if errors:
        raise jsonschema.ValidationError("; ".join(f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
                                                   for e in errors))
    unknown = unknown_fields(document, schema)
    if unknown:
        raise ValueError(f"not fields of KubeRay's RayService schema: {', '.join(unknown)}")


@pytest.fixture
def store(tmp_path):
    """A model store of one archive; only its model-config.yaml is read (the archive pins no batching)."""
    folder = tmp_path / "store"
    folder.mkdir()
    with zipfile.ZipFile(folder / "resnet18.mar", "w") as archive:
        archive.writestr("model-config.yaml", yaml.safe_dump({}))
    return folder


def service(store, policy=CPU_2_CORES, **options) -> dict:
    return deploy_ray.ray_service(store, "resnet18", policy, ray.__version__, **options)


@pytest.mark.parametrize("policy", [CPU_2_CORES, ONE_GPU], ids=["cpu", "gpu"])
def test_the_ray_service_passes_kuberays_crd_schema(store, schema, policy):
    document = service(store, policy)
    validate_ray_service(document, schema)
    # and once written and read back as YAML, as kubectl would send it
    validate_ray_service(yaml.safe_load(deploy_ray.dump_yaml([document], "")), schema)


def test_a_wrong_type_or_a_misspelled_field_is_refused(store, schema):
    wrong_type = service(store)
    wrong_type["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplicas"] = "eight"
    with pytest.raises(jsonschema.ValidationError, match="maxReplicas"):
        validate_ray_service(wrong_type, schema)
    missing = service(store)
    del missing["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["groupName"]
    with pytest.raises(jsonschema.ValidationError, match="groupName"):
        validate_ray_service(missing, schema)
    misspelled = service(store)
    config = misspelled["spec"]["rayClusterConfig"]
    config["enableInTreeAutoScaling"] = config.pop("enableInTreeAutoscaling")
    worker = config["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    worker["volumeMount"] = worker.pop("volumeMounts")
    jsonschema.Draft7Validator(without_kubernetes_keys(schema)).validate(misspelled)  # the schema alone lets them by
    with pytest.raises(ValueError) as refused:
        validate_ray_service(misspelled, schema)
    named = set(str(refused.value).split(": ", 1)[1].split(", "))
    assert named == {"$.spec.rayClusterConfig.enableInTreeAutoScaling",
                     "$.spec.rayClusterConfig.workerGroupSpecs[0].template.spec.containers[0].volumeMount"}


def test_serve_config_v2_is_the_validated_serve_config_of_the_archive_in_the_pods(store):
    document = service(store)
    config = yaml.safe_load(document["spec"]["serveConfigV2"])
    assert validated(config) == config
    (application,) = config["applications"]
    assert application["import_path"] == "serving.ray.deployment:application"
    assert application["args"]["archive"] == "/mnt/models/model-store/resnet18.mar"
    assert config["proxy_location"] == "EveryNode" and config["http_options"]["port"] == HTTP_PORT
    # the policy's deployment options, but up to the worker group's pods' worth of replicas
    (deployment,) = application["deployments"]
    expected = deployment_options(CPU_2_CORES)
    expected["autoscaling_config"]["max_replicas"] = CPU_2_CORES.workers * MAX_REPLICAS
    assert deployment == {"name": "resnet18", **expected}
    moved = service(store, cluster_model_store=deploy_ray.PurePosixPath("/models"))
    assert yaml.safe_load(moved["spec"]["serveConfigV2"])["applications"][0]["args"]["archive"] == "/models/resnet18.mar"
    mount = moved["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]
    assert mount["mountPath"] == "/models" and mount["subPath"] == "resnet18-ray/model-store" and mount["readOnly"]


def test_a_serve_config_rays_schema_refuses_is_not_written(store):
    """The RayService's Serve config goes through serve_config.validated: a batch of 0 (max_ongoing_requests 0)
    is refused by Ray's own schema before any YAML exists."""
    from pydantic import ValidationError
    with pytest.raises(ValidationError, match="max_ongoing_requests"):
        service(store, dataclasses.replace(CPU_2_CORES, batch_size=0))


@pytest.mark.parametrize("policy", [CPU_2_CORES, ONE_GPU, THREE_BY_TWO],
                         ids=["cpu", "gpu", "3x2"])
def test_pods_are_the_machine_of_the_serving_policy(store, policy):
    cluster = service(store, policy)["spec"]["rayClusterConfig"]
    (head,) = cluster["headGroupSpec"]["template"]["spec"]["containers"]
    (group,) = cluster["workerGroupSpecs"]
    (worker,) = group["template"]["spec"]["containers"]
    cpus = policy.workers * policy.threads_per_worker
    per_cpu = int(RESOURCES["cpu"]["requests"]["memory"].removesuffix("Gi")) // int(RESOURCES["cpu"]["requests"]["cpu"])
    assert worker["resources"]["limits"]["cpu"] == str(cpus) == head["resources"]["limits"]["cpu"]
    assert worker["resources"]["limits"]["memory"] == f"{cpus * per_cpu}Gi"
    assert worker["resources"]["requests"] == worker["resources"]["limits"]
    assert worker["resources"]["limits"].get("nvidia.com/gpu") == (str(policy.workers) if policy.device == "gpu"
                                                                   else None)
    assert "nvidia.com/gpu" not in head["resources"]["limits"]  # the head runs no replica
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    assert (group["minReplicas"], group["maxReplicas"], cluster["enableInTreeAutoscaling"]) == (1, MAX_REPLICAS, True)
    # a replica fits in a worker pod, and the policy's replicas fill one
    deployment = yaml.safe_load(service(store, policy)["spec"]["serveConfigV2"])["applications"][0]["deployments"][0]
    assert deployment["ray_actor_options"]["num_cpus"] * deployment["autoscaling_config"]["initial_replicas"] == cpus


def test_the_cluster_runs_our_image_with_the_installed_ray(store):
    cluster = service(store)["spec"]["rayClusterConfig"]
    assert cluster["rayVersion"] == ray.__version__
    containers = [cluster["headGroupSpec"]["template"]["spec"]["containers"][0],
                  cluster["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]]
    from serving.deploy.kserve_predictor import IMAGE_PLACEHOLDER
    assert {c["image"] for c in containers} == {IMAGE_PLACEHOLDER}
    assert all({"name": "PYTHONPATH", "value": "/app"} in c["env"] for c in containers)
    head_ports = {p["name"]: p["containerPort"] for p in containers[0]["ports"]}
    assert head_ports["serve"] == HTTP_PORT and {"gcs-server", "dashboard", "client"} <= set(head_ports)
    # KubeRay's operator deploys serveConfigV2 through the head's dashboard: it must listen beyond loopback
    assert cluster["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    assert "wget" not in str(containers[1]["readinessProbe"])  # our image has no wget; KubeRay's own check uses it


def test_the_image_installs_the_ray_of_pyprojects_extra_and_of_the_ray_service():
    """docker/Dockerfile's EXTRAS=serving,ray installs pyproject's ray extra at its pin, the Ray installed here."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (wanted,) = pyproject["project"]["optional-dependencies"]["ray"]
    installing = [run_script(run) for stage in parse_stages(DOCKERFILE) for run, _ in install_commands(stage)]
    # the pip install line takes its targets from `set -- ... "ray[serve]==PIN"` in the same RUN
    assert any(f'"{wanted.split()[0]}"' in script for script in installing)
    assert re.search(r"==([\d.]+)", wanted).group(1) == ray.__version__
    assert "ARG EXTRAS=serving\n" in DOCKERFILE.read_text()  # the image's default stays without Ray


def test_the_claim_and_upload_pod_are_valid_kubernetes():
    claim, upload = deploy_ray.storage_objects(100 * 2**20)
    validate_kubernetes(claim)
    validate_kubernetes(upload)
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert upload["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    broken = copy.deepcopy(claim)
    broken["spec"]["accessMode"] = broken["spec"].pop("accessModes")
    with pytest.raises(Exception, match="accessMode"):
        validate_kubernetes(broken)


def test_the_pod_templates_are_valid_kubernetes(store):
    """Each group's template as the pod KubeRay makes of it (its own container command aside)."""
    cluster = service(store, ONE_GPU)["spec"]["rayClusterConfig"]
    for template in (cluster["headGroupSpec"]["template"], cluster["workerGroupSpecs"][0]["template"]):
        validate_kubernetes({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ray"}, **template})


def test_the_command_writes_the_service_the_storage_and_the_claim(store, tmp_path, schema, capsys):
    export = tmp_path / "export"
    export.mkdir()
    (export / "manifest.json").write_text(manifest("onnx-traced", ("traced", "onnx-traced")).to_json())
    out = tmp_path / "ray"
    assert main(["deploy", "ray", str(out), "--export-dir", str(export), "--model-store", str(store),
                 "--workers", "3", "--threads", "1"]) == 0
    assert (out / "storage" / "model-store" / "resnet18.mar").read_bytes() == (store / "resnet18.mar").read_bytes()
    document, *policies = yaml.safe_load_all((out / "rayservice.yaml").read_text())
    validate_ray_service(document, schema)
    assert [p["metadata"]["name"] for p in policies] == ["resnet18-ray-head", "resnet18-ray-worker"]
    for policy in policies:
        validate_kubernetes(policy)
    assert document["metadata"]["name"] == "resnet18-ray"
    deployment = yaml.safe_load(document["spec"]["serveConfigV2"])["applications"][0]["deployments"][0]
    assert deployment["autoscaling_config"]["initial_replicas"] == 3
    said = (out / "rayservice.yaml").read_text()
    assert "#   workers 3: --workers" in said and "#   threads 1: --threads" in said  # each value's reason
    for object_ in yaml.safe_load_all((out / "storage-pvc.yaml").read_text()):
        validate_kubernetes(object_)
    assert "kubectl cp storage/. vision-export-models-ray-upload:/pv/resnet18-ray" in capsys.readouterr().out
    assert main(["deploy", "ray", str(out), "--export-dir", str(export), "--model-store", str(store)]) == 1
    assert "pass --force" in capsys.readouterr().err
    assert main(["deploy", "ray", str(tmp_path / "elsewhere"), "--export-dir", str(export), "--model-store",
                 str(store), "--cluster-model-store", "models"]) == 1
    assert "absolute path" in capsys.readouterr().err


def test_only_the_cluster_and_kuberays_operator_reach_the_dashboard_and_clients_reach_serve_alone(store, schema):
    """Ray opens its dashboard (which runs jobs), GCS and raylets on the pods' addresses: the NetworkPolicies let
    the cluster's own pods in on every port, the operator in on the head's dashboard, and anyone else on Serve's
    port only; they select the pods by the label both pod templates carry."""
    head, worker = deploy_ray.network_policies("resnet18")
    document = deploy_ray.ray_service(store, "resnet18", machine_policy(0, 4), "2.0.0")
    cluster = document["spec"]["rayClusterConfig"]
    for template in (cluster["headGroupSpec"]["template"], cluster["workerGroupSpecs"][0]["template"]):
        assert template["metadata"]["labels"] == {deploy_ray.SERVICE_LABEL: "resnet18-ray"}
    validate_ray_service(document, schema)
    for policy, node_type in ((head, "head"), (worker, "worker")):
        validate_kubernetes(policy)
        assert policy["spec"]["podSelector"]["matchLabels"] == {deploy_ray.SERVICE_LABEL: "resnet18-ray",
                                                                 "ray.io/node-type": node_type}
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        rules = policy["spec"]["ingress"]
        assert rules[0] == {"from": [{"podSelector": {"matchLabels": {deploy_ray.SERVICE_LABEL: "resnet18-ray"}}}]}
        anyone = [rule for rule in rules if "from" not in rule]
        assert anyone == [{"ports": [{"protocol": "TCP", "port": deploy_ray.HTTP_PORT}]}]
    (operator,) = [rule for rule in head["spec"]["ingress"][1:] if "from" in rule]
    assert operator["from"][0]["podSelector"]["matchLabels"] == deploy_ray.OPERATOR_LABELS
    assert operator["ports"] == [{"protocol": "TCP", "port": deploy_ray.RAY_PORTS["dashboard"]}]
    assert len(worker["spec"]["ingress"]) == 2  # no operator rule: a worker has no dashboard
