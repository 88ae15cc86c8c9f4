"""Deployment material, the pure parts: configs, autoscaling numbers, and the validators rejecting bad objects."""

import json

import pytest
from google.protobuf.text_format import ParseError

from serving.deploy.common import MEASURED_CPU_REPLICA_RPS, DeployError, ReplicaNumbers, replica_numbers
from serving.deploy.kserve import inference_service, kserve_config_properties, storage_upload_objects
from serving.deploy.kserve_predictor import engine_inference_service
from serving.deploy.triton import served_onnx
from tests.serving.manifests import manifest
from tests.serving.schemas import parse_model_config, validate_inference_service, validate_kubernetes

NUMBERS = ReplicaNumbers(16.0, 2, "test")


def test_kserve_config_has_what_kserve_needs():
    text = kserve_config_properties("resnet18", "resnet18.mar", "cpu")
    settings = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    assert settings["enable_envvars_config"] == "true" and settings["service_envelope"] == "kserve"
    assert settings["model_store"] == "/mnt/models/model-store"
    model = json.loads(settings["model_snapshot"])["models"]["resnet18"]["1.0"]
    assert model["marName"] == "resnet18.mar" and model["batchSize"] == 1 and model["minWorkers"] == 2


@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_inference_services_pass_the_kserve_sdk_schema(device):
    service = validate_inference_service(inference_service("resnet", device, NUMBERS, "pvc://claim/resnet"))
    predictor = service.spec.predictor
    assert predictor.model.model_format.name == "pytorch" and predictor.scale_metric == "concurrency"
    assert ("nvidia.com/gpu" in predictor.model.resources.limits) == (device == "gpu")
    assert predictor.model.readiness_probe._exec.command[0] == "python3"


def test_the_sdk_schema_rejects_a_misspelled_field():
    document = inference_service("resnet", "cpu", NUMBERS, "pvc://claim/resnet")
    document["spec"]["predictor"]["model"]["storageURI"] = document["spec"]["predictor"]["model"].pop("storageUri")
    with pytest.raises(AssertionError, match=r"V1beta1ModelSpec has no field\(s\) \['storageURI'\]"):
        validate_inference_service(document)


def test_storage_objects_are_valid_kubernetes_and_a_broken_one_is_not():
    pvc, pod = storage_upload_objects(100 * 2**20)
    validate_kubernetes(pvc)
    validate_kubernetes(pod)
    pod["spec"]["containers"][0]["volumeMount"] = pod["spec"]["containers"][0].pop("volumeMounts")
    with pytest.raises(Exception, match="volumeMount"):
        validate_kubernetes(pod)


def test_triton_schema_rejects_an_unknown_field():
    assert parse_model_config('name: "m"\nmax_batch_size: 8').max_batch_size == 8
    with pytest.raises(ParseError):
        parse_model_config('name: "m"\nmax_batch: 8')


def test_replica_numbers_come_from_the_benchmark_when_it_ran(tmp_path):
    results = tmp_path / "results.json"
    rows = [{"configuration": "default", "model": "resnet18", "concurrency": c, "req_per_s": r}
            for c, r in ((1, 7.0), (2, 14.5), (4, 16.0), (8, 15.8))]
    results.write_text(json.dumps(rows + [{**rows[0], "model": "resnet50", "req_per_s": 99.0}]))
    numbers = replica_numbers("resnet18", results)
    assert numbers.requests_per_s == 16.0 and numbers.saturating_concurrency == 2 and str(results) in numbers.source
    assert replica_numbers("resnet50", results).requests_per_s == 99.0  # each model its own rows
    assert replica_numbers("resnet18", tmp_path / "absent.json").requests_per_s == MEASURED_CPU_REPLICA_RPS


def test_without_rows_of_this_model_the_fallback_is_said(tmp_path, capsys):
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"configuration": "default", "model": "resnet50", "concurrency": 1,
                                    "req_per_s": 9.0}]))
    assert replica_numbers("resnet18", results).requests_per_s == MEASURED_CPU_REPLICA_RPS
    assert "no 'default' rows of resnet18" in capsys.readouterr().out


def test_triton_takes_the_served_artifact_decided_at_export():
    assert served_onnx(manifest("onnx-traced", ("onnx-dynamo", "onnx-traced"))).kind == "onnx-traced"


def test_triton_refuses_a_served_torchscript_and_says_which_serve_to_export_with():
    with pytest.raises(DeployError, match=r"serves scripted \(torchscript\).*re-export with `--serve onnx-dynamo`"):
        served_onnx(manifest("scripted", ("scripted", "onnx-dynamo")))
    with pytest.raises(DeployError, match="no servable ONNX artifact"):
        served_onnx(manifest("scripted", ("scripted", "onnx-dynamo"), candidates={"onnx-dynamo": "failed parity"}))


def test_the_kserve_engines_inference_service_passes_the_sdk_schema():
    service = validate_inference_service(engine_inference_service("resnet", NUMBERS, "pvc://claim/resnet-kserve"))
    predictor = service.spec.predictor
    (container,) = predictor.containers
    env = {variable.name: variable.value for variable in container.env}
    assert env["ENGINE"] == "kserve" and env["STORAGE_URI"] == "pvc://claim/resnet-kserve"
    assert env["MODEL_STORE"] == "/mnt/models/model-store" and env["KSERVE_HTTP_PORT"] == "8080"
    assert container.ports[0].container_port == 8080 and predictor.scale_metric == "concurrency"
    # liveness and readiness are the engine's own routes (serving/kserve/signals.py), scraped as annotated
    assert container.liveness_probe.http_get.path == "/health/live"
    assert container.readiness_probe.http_get.path == "/health/ready" and container.readiness_probe.http_get.port == 8080
    annotations = service.metadata.annotations
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/path"] == "/metrics"


def test_the_kserve_engine_takes_its_own_benchmark_rows(tmp_path):
    results = tmp_path / "results.json"
    rows = [{"configuration": name, "model": "resnet18", "concurrency": c, "req_per_s": r}
            for name, c, r in (("default", 4, 16.0), ("kserve", 1, 10.0), ("kserve", 4, 20.0))]
    results.write_text(json.dumps(rows))
    numbers = replica_numbers("resnet18", results, configuration="kserve")
    assert numbers.requests_per_s == 20.0 and numbers.saturating_concurrency == 4 and "'kserve'" in numbers.source
    fallback = replica_numbers("resnet18", tmp_path / "absent.json", configuration="kserve")
    assert "docs/results/2026-11-24-serving-bench-kserve-engine" in fallback.source
