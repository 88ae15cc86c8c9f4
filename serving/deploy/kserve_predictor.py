"""KServe with our own predictor: a custom container (our image, ENGINE=kserve) in which KServe's protocol
serves the archive through our request core (python -m serving --engine kserve). The TorchServe runtime's
material is kserve.py; this path does not depend on KServe keeping that runtime.

Storage layout at the storageUri: model-store/NAME.mar (the archive `python -m export` built). KServe's storage
initializer copies it to /mnt/models when the container names it in STORAGE_URI (KServe's way for custom
containers); the entrypoint serves /mnt/models/model-store. Written: kserve-engine/storage/ and
kserve-engine/inferenceservice.yaml (CPU: 2 workers x 1 thread, the serving policy of the 2-CPU request).
"""

from __future__ import annotations

from pathlib import Path

from serving.deploy.common import (
    API_VERSION,
    RESOURCES,
    ReplicaNumbers,
    autoscaling,
    dump_yaml,
    replica_numbers,
)

ENGINE_FOLDER = "kserve-engine"
LIVE_ROUTE, READY_ROUTE = "/health/live", "/health/ready"  # serving/kserve/signals.py's
IMAGE_PLACEHOLDER = "vision-export-torchserve:latest"  # compose.yaml's image: push it where the cluster pulls from
MOUNT = "/mnt/models"  # where KServe's storage initializer puts the storageUri's contents
CONTAINER_PORT = 8080  # KServe's default HTTP port, which the entrypoint's KSERVE_HTTP_PORT keeps
CONTAINER_NAME = "kserve-container"  # KServe's name for the predictor's serving container


def engine_container(model_name: str, storage_uri: str, image: str) -> dict:
    env = {"ENGINE": "kserve", "MODEL": model_name, "MODEL_STORE": f"{MOUNT}/model-store",
           "KSERVE_HOST": "0.0.0.0", "KSERVE_HTTP_PORT": str(CONTAINER_PORT), "STORAGE_URI": storage_uri}
    return {
        "name": CONTAINER_NAME,
        "image": image,
        "env": [{"name": key, "value": value} for key, value in env.items()],
        "ports": [{"containerPort": CONTAINER_PORT, "protocol": "TCP"}],
        "resources": RESOURCES["cpu"],
        # liveness: the server answers; readiness: every model has a live inference worker (serving/kserve/signals.py)
        "livenessProbe": {"httpGet": {"path": LIVE_ROUTE, "port": CONTAINER_PORT}, "initialDelaySeconds": 20,
                          "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6},
        "readinessProbe": {"httpGet": {"path": READY_ROUTE, "port": CONTAINER_PORT}, "initialDelaySeconds": 20,
                           "periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 2},
    }


def scrape_annotations(port: int, path: str = "/metrics") -> dict:
    """The pod annotations a Prometheus with the usual kubernetes-pods job scrapes by (KServe passes an
    InferenceService's annotations on to its pods)."""
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": path,
            "serving.kserve.io/enable-prometheus-scraping": "true"}


def engine_inference_service(model_name: str, numbers: ReplicaNumbers, storage_uri: str,
                             image: str = IMAGE_PLACEHOLDER) -> dict:
    return {
        "apiVersion": API_VERSION,
        "kind": "InferenceService",
        "metadata": {"name": f"{model_name}-kserve", "annotations": {
            "vision-export/engine": "kserve",
            **scrape_annotations(CONTAINER_PORT),  # Prometheus' pod annotations: our /metrics (docs/observability.md)
            "vision-export/throughput-source": numbers.source,
            "vision-export/replica-requests-per-second": f"{numbers.requests_per_s:.1f}"}},
        "spec": {"predictor": {**autoscaling("cpu", numbers),
                               "containers": [engine_container(model_name, storage_uri, image)]}},
    }


def write_engine_material(staging: Path, archive: Path, model_name: str, storage_uri: str, link,
                          finish=lambda service: service) -> None:
    """kserve-engine/: the storage folder (model-store/NAME.mar) and its InferenceService (finish: what the
    caller adds to it, e.g. the version)."""
    folder = staging / ENGINE_FOLDER
    (folder / "storage" / "model-store").mkdir(parents=True)
    link(archive, folder / "storage" / "model-store" / archive.name)
    numbers = replica_numbers(model_name, configuration="kserve")
    uri = storage_uri.format(model=model_name, device="kserve")
    header = (f"# KServe InferenceService for {model_name}: our image with ENGINE=kserve (KServe's own ModelServer "
              "and our request core), written by `python -m serving deploy kserve`.\n"
              "# storageUri is a placeholder: copy "
              f"{ENGINE_FOLDER}/storage/ there (docs/scaling.md); the image too.\n"
              f"# Autoscaling target from: {numbers.source}.\n")
    service = finish(engine_inference_service(model_name, numbers, uri))
    (folder / "inferenceservice.yaml").write_text(dump_yaml([service], header))
