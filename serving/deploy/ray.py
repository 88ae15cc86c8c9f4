"""`python -m serving deploy ray OUT`: a KubeRay RayService (ray.io/v1) that serves the export's archive with our
image, and the storage folder and claim the archive reaches its pods through.

Written into OUT:
- storage/model-store/NAME.mar: the archive `python -m export` built, as in the kserve material;
- storage-pvc.yaml: a ReadWriteMany claim and a pod to `kubectl cp` storage/ onto it (KServe's claim is
  ReadWriteOnce, which pods on several nodes cannot mount together; a Ray cluster's pods are on several nodes);
- rayservice.yaml: serveConfigV2 is the Serve config serving/ray/serve_config.py builds and validates, with the
  archive read at --cluster-model-store (the claim's folder mounted there, read-only, on every pod);
  rayClusterConfig runs our image (built with Ray: --build-arg EXTRAS=serving,ray) with the installed Ray's
  version, a head pod that runs Serve's controller and a proxy but no replica, and one worker group that
  KubeRay's autoscaler grows when Serve asks for replicas that do not fit.

Every pod is the machine the archive's serving policy was resolved for (contract/policy.py: this machine, the
archive's pins, --workers / --threads): its CPUs are the policy's workers x threads (a GPU per worker on a GPU
machine), its memory per CPU the kserve material's (common.RESOURCES). One worker pod holds the policy's
replicas; Serve may ask for up to MAX_REPLICAS pods' worth, the worker group's maximum.
"""

from __future__ import annotations

import shutil
from pathlib import Path, PurePosixPath

from contract.policy import PolicyChoices, ServingPolicy, resolve_policy
from contract.versions import label_of
from handlers.policy import this_machine_resources
from serving.deploy.common import (
    MAX_REPLICAS,
    RESOURCES,
    DeployError,
    dump_yaml,
    exported_archive,
    fresh_output,
    publish,
)
from serving.deploy.kserve import PVC_NAME, VERSION_ANNOTATION, storage_upload_objects
from serving.deploy.kserve_predictor import IMAGE_PLACEHOLDER, MOUNT
from serving.ray.config import HTTP_PORT, OBJECT_STORE_BYTES
from serving.ray.serve_config import versioned_name
from serving.settings import archive_pins, archive_version

API_VERSION = "ray.io/v1"  # KubeRay's RayService (validated against KubeRay v1.7.0's CRD in the tests)
CLUSTER_MODEL_STORE = PurePosixPath(MOUNT) / "model-store"  # where the pods read the archives, as kserve-engine/
CLAIM_NAME = f"{PVC_NAME}-ray"  # a claim of its own: KServe's is ReadWriteOnce, and one claim's mode cannot change
# Pods on several nodes mount it at once (the upload pod writes it, the Ray pods read it): the storage class must
# offer ReadWriteMany (NFS, CephFS, EFS, Filestore, ...).
CLAIM_ACCESS_MODES = ["ReadWriteMany"]
APP_ROOT = "/app"  # where docker/Dockerfile copies the packages: Ray's workers import serving.ray.deployment there
WORKER_GROUP = "replicas"
# The kserve material's memory per CPU (its CPU predictor: 4Gi for 2 CPUs), so that a pod of either holds the
# same per-CPU model copies and request buffers.
KSERVE_CPU_POD = RESOURCES["cpu"]["requests"]
MEMORY_GI_PER_CPU = int(KSERVE_CPU_POD["memory"].removesuffix("Gi")) // int(KSERVE_CPU_POD["cpu"])
# KubeRay's port names and Ray's default ports (kuberay ray-operator/controllers/ray/utils/constant.go). Listing
# any port on the head container replaces KubeRay's defaults for its Services, so all four are listed; "serve" is
# the port of Serve's proxies (the Serve config's http_options.port) that KubeRay's serve Service targets.
RAY_PORTS = {"gcs-server": 6379, "dashboard": 8265, "client": 10001, "serve": HTTP_PORT}
DASHBOARD_AGENT_PORT = 52365  # Ray's dashboard agent (KubeRay's health checks ask it)
# Every node offers Ray's object store only what Serve passes between its actors (serving/ray/config.py: no
# tensor travels through it), as the local engine's head node does; KubeRay would size it from the pod's memory.
OBJECT_STORE = str(OBJECT_STORE_BYTES)
HEAD_START_PARAMS = {
    # KubeRay's RayService controller, in the operator's pod, deploys serveConfigV2 and reads the applications'
    # status through the head's dashboard HTTP API (port "dashboard"): at loopback it could not reach it.
    # KubeRay sets 0.0.0.0 itself when absent; said here so that no one narrows it without knowing. The dashboard
    # runs jobs: only the operator should reach it (a NetworkPolicy, docs/scaling.md).
    "dashboard-host": "0.0.0.0",
    # No replica on the head: its CPUs go to the GCS, Serve's controller and its proxy, and a replica that
    # overloads it would take the cluster's state down with it (as KubeRay v1.7.0's autoscaler samples do).
    "num-cpus": "0",
    "object-store-memory": OBJECT_STORE,
}
WORKER_START_PARAMS = {"object-store-memory": OBJECT_STORE}
# A worker pod is ready when its raylet and its Serve proxy answer. KubeRay's own check of a RayService's workers
# runs `wget`, which docker/Dockerfile does not install: this is that check in the image's Python. KubeRay's delay
# and period; 5 s to answer (a Python starts); one failed check takes the pod out of the serve Service at once, as
# KubeRay's does (its ServeReadinessProbeFailureThreshold).
READINESS_SCRIPT = (
    "import urllib.request as u;"
    f"[u.urlopen(url,timeout=4).read() for url in ('http://127.0.0.1:{DASHBOARD_AGENT_PORT}/api/healthz',"
    f"'http://127.0.0.1:{HTTP_PORT}/-/healthz')]")
WORKER_READINESS = {"exec": {"command": ["python3", "-c", READINESS_SCRIPT]},
                    "initialDelaySeconds": 10, "periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 1}


class BlockText(str):
    """A string YAML writes as a literal block (serveConfigV2 reads as the Serve config it is)."""


def _block(dumper, text: BlockText):
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(text), style="|")


def pod_resources(policy: ServingPolicy, gpus: bool = True) -> dict:
    """One pod as the machine the policy was decided for: every replica of the policy at once (workers x threads
    CPUs, a GPU per worker on a GPU machine), requests = limits as in the kserve material's CPU predictor."""
    cpus = policy.workers * policy.threads_per_worker
    amounts = {"cpu": str(cpus), "memory": f"{cpus * MEMORY_GI_PER_CPU}Gi"}
    if gpus and policy.device == "gpu":
        amounts["nvidia.com/gpu"] = str(policy.workers)
    return {"requests": amounts, "limits": dict(amounts)}


def cluster_serve_config(model_store: Path, model_name: str, policy: ServingPolicy,
                         cluster_model_store: PurePosixPath = CLUSTER_MODEL_STORE) -> dict:
    """serving/ray/serve_config.py's Serve config, validated, for the archive read at cluster_model_store. Min
    and initial replicas are the policy's (one worker pod's worth); at most MAX_REPLICAS pods' worth, the worker
    group's maximum, so that Serve asks for the pods KubeRay's autoscaler may add."""
    from serving.ray.serve_config import serve_config, validated
    config = serve_config(model_store, {model_name: policy}, Path(cluster_model_store))
    for application in config["applications"]:
        for deployment in application["deployments"]:
            deployment["autoscaling_config"]["max_replicas"] = policy.workers * MAX_REPLICAS
    return validated(config)


def container(name: str, policy: ServingPolicy, image: str, gpus: bool, ports: dict[str, int],
              model_name: str, cluster_model_store: PurePosixPath) -> dict:
    """Our image (KubeRay replaces its ENTRYPOINT with `ray start`: the image must carry Ray), the claim's folder of
    this model mounted read-only at cluster_model_store, /dev/shm in memory for Ray's object store (Kubernetes
    gives 64 MiB otherwise)."""
    return {
        "name": name,
        "image": image,
        "env": [{"name": "PYTHONPATH", "value": APP_ROOT}],
        "ports": [{"name": port, "containerPort": number, "protocol": "TCP"} for port, number in ports.items()],
        "resources": pod_resources(policy, gpus),
        "volumeMounts": [{"name": "models", "mountPath": str(cluster_model_store),
                          "subPath": f"{storage_folder(model_name)}/model-store", "readOnly": True},
                         {"name": "dshm", "mountPath": "/dev/shm"}],
    }


# Our label on both pod templates: KubeRay names the RayService's cluster (and its `ray.io/cluster` label) with a
# suffix of its own, so the NetworkPolicies select the pods by the service's name.
SERVICE_LABEL = "vision-export/ray-service"
# The KubeRay operator's pods (its Helm chart's label, which KubeRay's own network isolation selects them by).
OPERATOR_LABELS = {"app.kubernetes.io/component": "kuberay-operator"}


def pod_template(container_spec: dict, service_name: str) -> dict:
    return {"metadata": {"labels": {SERVICE_LABEL: service_name}},
            "spec": {"containers": [container_spec], "volumes": [
        {"name": "models", "persistentVolumeClaim": {"claimName": CLAIM_NAME, "readOnly": True}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": OBJECT_STORE}}]}}


def storage_folder(model_name: str) -> str:
    """This model's folder on the claim, named as the kserve material's ({model}-{device})."""
    return f"{model_name}-ray"


def ray_service(model_store: Path, model_name: str, policy: ServingPolicy, ray_version: str,
                cluster_model_store: PurePosixPath = CLUSTER_MODEL_STORE, image: str = IMAGE_PLACEHOLDER) -> dict:
    """The RayService: serveConfigV2 the validated Serve config (cluster_serve_config), rayClusterConfig the head
    and the worker group from our image with the policy's pods."""
    import yaml
    yaml.SafeDumper.add_representer(BlockText, _block)
    config = cluster_serve_config(model_store, model_name, policy, cluster_model_store)
    name = service_name(model_name)
    head = container("ray-head", policy, image, False, RAY_PORTS, model_name, cluster_model_store)
    worker = container("ray-worker", policy, image, True, {"serve": HTTP_PORT}, model_name, cluster_model_store)
    worker["readinessProbe"] = WORKER_READINESS
    return {
        "apiVersion": API_VERSION,
        "kind": "RayService",
        "metadata": {"name": name, "annotations": {
            "vision-export/policy": policy.reason,
            VERSION_ANNOTATION: label_of(archive_version(Path(model_store) / f"{model_name}.mar"))}},
        "spec": {
            "serveConfigV2": BlockText(yaml.safe_dump(config, sort_keys=False)),
            "rayClusterConfig": {
                "rayVersion": ray_version,
                "enableInTreeAutoscaling": True,
                "headGroupSpec": {"rayStartParams": HEAD_START_PARAMS,
                                  "template": pod_template(head, name)},
                "workerGroupSpecs": [{"groupName": WORKER_GROUP, "replicas": 1, "minReplicas": 1,
                                      "maxReplicas": MAX_REPLICAS, "rayStartParams": WORKER_START_PARAMS,
                                      "template": pod_template(worker, name)}],
            }},
    }


def service_name(model_name: str) -> str:
    return f"{model_name}-ray"


def network_policies(model_name: str) -> list[dict]:
    """Deny by default what Ray opens on the pods' addresses: the cluster's pods reach each other on every port
    (GCS, raylets, object transfers), KubeRay's operator reaches the head's dashboard (it deploys serveConfigV2
    through it; the dashboard also runs jobs, so no one else may), and clients reach Serve's proxies alone."""
    name = service_name(model_name)
    cluster = {"podSelector": {"matchLabels": {SERVICE_LABEL: name}}}
    clients = {"ports": [{"protocol": "TCP", "port": HTTP_PORT}]}
    operator = {"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": OPERATOR_LABELS}}],
                "ports": [{"protocol": "TCP", "port": RAY_PORTS["dashboard"]}]}

    def policy(node_type: str, ingress: list[dict]) -> dict:
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": f"{name}-{node_type}"},
                "spec": {"podSelector": {"matchLabels": {SERVICE_LABEL: name, "ray.io/node-type": node_type}},
                         "policyTypes": ["Ingress"], "ingress": ingress}}
    return [policy("head", [{"from": [cluster]}, operator, clients]), policy("worker", [{"from": [cluster]}, clients])]


def storage_objects(archive_bytes: int) -> list[dict]:
    """The kserve material's claim and upload pod (serving/deploy/kserve.py, its size too), as a claim of its own
    that pods on several nodes mount at once."""
    claim, upload = storage_upload_objects(archive_bytes)
    claim["metadata"]["name"] = CLAIM_NAME
    claim["spec"]["accessModes"] = CLAIM_ACCESS_MODES
    upload["metadata"]["name"] = f"{CLAIM_NAME}-upload"
    upload["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] = CLAIM_NAME
    return [claim, upload]


def installed_ray_version() -> str:
    try:
        import ray
        import ray.serve  # the Serve config is validated with its schema
    except ImportError:
        raise DeployError("Ray Serve is not installed: pip install '.[ray]' (the RayService's Serve config is "
                          "validated with Ray's own schema, and its rayVersion is the installed Ray's)") from None
    return ray.__version__


def write_ray(out: Path, export_dir: Path, model_store: Path, model_name: str | None, flags: PolicyChoices,
              cluster_model_store: PurePosixPath = CLUSTER_MODEL_STORE, force: bool = False) -> Path:
    """storage/model-store/NAME.mar, storage-pvc.yaml and rayservice.yaml (model_name: default the model's), the
    pods the machine of the archive's policy as resolved here (this machine, its pins, the flags)."""
    version = installed_ray_version()
    manifest, model_name, archive = exported_archive(export_dir, model_store, model_name)
    policy = resolve_policy(this_machine_resources(), archive_pins(archive), flags)
    cluster_model_store = PurePosixPath(cluster_model_store)
    if not cluster_model_store.is_absolute():
        raise DeployError(f"--cluster-model-store {cluster_model_store}: give an absolute path inside the pods")
    service = ray_service(Path(model_store), model_name, policy, version, cluster_model_store)
    staging = fresh_output(Path(out), force)
    (staging / "storage" / "model-store").mkdir(parents=True)
    shutil.copy2(archive, staging / "storage" / "model-store" / versioned_name(Path(model_store), model_name))
    folder = storage_folder(model_name)
    (staging / "storage-pvc.yaml").write_text(dump_yaml(
        storage_objects(archive.stat().st_size),
        "# A ReadWriteMany claim for the archive, and a pod to copy it there:\n# kubectl apply -f storage-pvc.yaml; "
        f"kubectl cp storage/. {CLAIM_NAME}-upload:/pv/{folder}\n"))
    (staging / "rayservice.yaml").write_text(dump_yaml([service, *network_policies(model_name)], (
        f"# KubeRay RayService for {model_name} ({manifest.served_record().kind}) served by Ray Serve with our image "
        "(written by `python -m serving deploy ray`).\n"
        f"# The image must carry Ray {version}: docker build --build-arg EXTRAS=serving,ray (docs/scaling.md).\n"
        f"# The archive is read from the claim {CLAIM_NAME} ({folder}/model-store) at {cluster_model_store}.\n"
        "# NetworkPolicies: the pods reach each other, KubeRay's operator the head's dashboard, clients Serve's port.\n"
        f"# Serving policy of the pods: {policy.reason}.\n"
        + "".join(f"#   {line}\n" for line in policy.lines()))))
    return publish(staging, Path(out))
