"""`python -m serving kserve`: KServe's TorchServe runtime material, validated with real schemas.

The InferenceService is built into KServe's own SDK models (kserve 0.21; the package ships no CRD schema),
refusing any key the SDK's schema lacks and any wrong type, and its container part (resources, env, probe)
is validated as a core Kubernetes container with kubernetes-validate (strict); the PVC and Pod are validated
with kubernetes-validate directly. Each validator is shown to reject a broken object."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from models.errors import VisionExportError
from serving.deploy_common import (MEASURED, DeployError, Measurements, measurements, scale_target,
                                   staged_output)
from serving.kserve import config_properties, inference_service, storage_upload_objects
from tests.conftest import ROOT

KUBERNETES_VERSION = "1.37.0"  # the newest schema kubernetes-validate 1.37 ships
KSERVE_ONLY_KEYS = ("modelFormat", "runtime", "runtimeVersion", "protocolVersion", "storageUri", "storage")
PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object}
NUMBERS = Measurements(16.0, 2, 125.0, 0.73, "test figures")


# ------------------------------------------------------------------ validators from the real schemas
def _sdk_class(name: str):
    import kserve.models
    import kubernetes.client.models
    for module in (kserve.models, kubernetes.client.models):
        if hasattr(module, name):
            return getattr(module, name)
    raise AssertionError(f"neither KServe's nor Kubernetes' SDK has a model named {name}")


def to_sdk_model(data, type_name: str, where: str = "$"):
    """Build the SDK object for `data`, refusing unknown keys and wrong types at every level."""
    if type_name in PRIMITIVES:
        assert isinstance(data, PRIMITIVES[type_name]), f"{where}: expected {type_name}, got {data!r}"
        return data
    if match := re.fullmatch(r"(?:list|List)\[(.+)\]", type_name):
        assert isinstance(data, list), f"{where}: expected a list"
        return [to_sdk_model(item, match.group(1), f"{where}[{i}]") for i, item in enumerate(data)]
    if match := re.fullmatch(r"dict\(str, (.+)\)|Dict\[str, (.+)\]", type_name):
        assert isinstance(data, dict), f"{where}: expected a mapping"
        return {k: to_sdk_model(v, match.group(1) or match.group(2), f"{where}.{k}") for k, v in data.items()}
    cls = _sdk_class(type_name)
    assert isinstance(data, dict), f"{where}: expected a {type_name} mapping"
    attribute = {json_key: attr for attr, json_key in cls.attribute_map.items()}
    unknown = sorted(set(data) - set(attribute))
    assert not unknown, f"{where}: {type_name} has no field(s) {unknown}"
    values = {attribute[k]: to_sdk_model(v, cls.openapi_types[attribute[k]], f"{where}.{k}") for k, v in data.items()}
    return cls(**values)  # the SDK's own constructor checks required fields


def validate_kubernetes(document: dict) -> None:
    kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def validate_inference_service(document: dict):
    """KServe's SDK schema for the whole object, Kubernetes' own schema for its container part."""
    service = to_sdk_model(document, "V1beta1InferenceService")
    assert service.api_version == "serving.kserve.io/v1beta1" and service.kind == "InferenceService"
    container = {k: v for k, v in document["spec"]["predictor"]["model"].items() if k not in KSERVE_ONLY_KEYS}
    validate_kubernetes({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "predictor"},
                         "spec": {"containers": [{"name": "kserve-container", "image": "runtime", **container}]}})
    return service


def properties(text: str) -> dict:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


# ------------------------------------------------------------------ pure parts
def test_config_properties_have_what_kserve_needs():
    for device, workers in (("gpu", 1), ("cpu", 2)):
        settings = properties(config_properties("resnet", "resnet.mar", device))
        assert settings["enable_envvars_config"] == "true" and settings["service_envelope"] == "kserve"
        assert settings["inference_address"].endswith(":8085")  # where KServe's wrapper looks for TorchServe
        assert settings["model_store"] == "/mnt/models/model-store"
        model = json.loads(settings["model_snapshot"])["models"]["resnet"]["1.0"]
        assert model["marName"] == "resnet.mar" and model["minWorkers"] == model["maxWorkers"] == workers
        assert model["batchSize"] == 1  # TorchServe's kserve envelope answers only the first request of a batch


@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_inference_services_pass_kserve_and_kubernetes_schemas(device):
    service = validate_inference_service(inference_service("resnet", device, NUMBERS, "pvc://claim/resnet"))
    predictor = service.spec.predictor
    assert predictor.model.model_format.name == "pytorch" and predictor.model.protocol_version == "v1"
    assert predictor.scale_metric == "concurrency" and predictor.scale_target == scale_target(device, NUMBERS)
    assert predictor.min_replicas == 1 and predictor.max_replicas > 1
    gpus = [r.get("nvidia.com/gpu") for r in (predictor.model.resources.requests, predictor.model.resources.limits)]
    assert gpus == (["1", "1"] if device == "gpu" else [None, None])
    assert "v1/models/resnet:predict" in predictor.model.readiness_probe._exec.command[-1]


def test_kserve_schema_rejects_a_misspelled_field():
    document = inference_service("resnet", "cpu", NUMBERS, "pvc://claim/resnet")
    model = document["spec"]["predictor"]["model"]
    model["storageURI"] = model.pop("storageUri")
    with pytest.raises(AssertionError, match=r"V1beta1ModelSpec has no field\(s\) \['storageURI'\]"):
        validate_inference_service(document)


def test_kserve_schema_rejects_a_wrong_type():
    document = inference_service("resnet", "cpu", NUMBERS, "pvc://claim/resnet")
    document["spec"]["predictor"]["scaleTarget"] = "two"
    with pytest.raises(AssertionError, match=r"scaleTarget: expected int"):
        validate_inference_service(document)


def test_kubernetes_schema_rejects_a_broken_probe_inside_the_inference_service():
    document = inference_service("resnet", "gpu", NUMBERS, "pvc://claim/resnet")
    probe = document["spec"]["predictor"]["model"]["readinessProbe"]
    probe["exec"]["command"] = "python3 -c 1"  # a string where Kubernetes wants a list
    with pytest.raises(AssertionError, match="expected a list"):  # the SDK's type check comes first
        validate_inference_service(document)
    container = {"name": "c", "image": "i", "readinessProbe": probe}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_kubernetes({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                             "spec": {"containers": [container]}})


def test_storage_objects_are_valid_kubernetes_and_a_broken_one_is_not():
    pvc, pod = storage_upload_objects(100 * 2**20)
    validate_kubernetes(pvc)
    validate_kubernetes(pod)
    broken = copy.deepcopy(pod)
    broken["spec"]["containers"][0]["volumeMount"] = broken["spec"]["containers"][0].pop("volumeMounts")
    with pytest.raises(kubernetes_validate.ValidationError, match="volumeMount"):
        validate_kubernetes(broken)


def test_measurements_come_from_the_benchmark_when_it_ran(tmp_path):
    results = tmp_path / "results.json"
    rows = [{"configuration": "default", "concurrency": c, "req_per_s": r, "p50_ms": p}
            for c, r, p in ((1, 7.0, 140.0), (2, 14.5, 150.0), (4, 16.0, 260.0), (8, 15.8, 500.0))]
    rows += [{"configuration": "batched", "concurrency": 8, "req_per_s": 8.0, "p50_ms": 900.0}]
    results.write_text(json.dumps(rows))
    numbers = measurements(results)
    assert (numbers.replica_rps, numbers.busy_concurrency, numbers.service_ms) == (16.0, 2, 140.0)
    assert numbers.batching_gain == 0.5 and str(results) in numbers.source
    assert scale_target("cpu", numbers) == 2


def test_measurements_fall_back_to_the_project_figures_and_refuse_a_missing_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no bench-results/ here
    assert measurements() == MEASURED and "measured in this project" in MEASURED.source
    with pytest.raises(DeployError, match="absent.json not found"):
        measurements(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text(json.dumps([{"configuration": "naive", "concurrency": 1, "req_per_s": 3}]))
    with pytest.raises(DeployError, match="no rows of configuration 'default'"):
        measurements(tmp_path / "bad.json")


def test_output_folder_is_replaced_whole_or_not_at_all(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(DeployError, match="not empty.*--force") as refused:
        with staged_output(out, force=False):
            pass
    assert isinstance(refused.value, VisionExportError)
    with pytest.raises(RuntimeError):
        with staged_output(out, force=True) as staging:
            (staging / "new.txt").write_text("half")
            raise RuntimeError("a step failed")
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (out / "old.txt").read_text() == "old"
    with staged_output(out, force=True) as staging:
        (staging / "new.txt").write_text("new")
    assert [p.name for p in out.iterdir()] == ["new.txt"] and [p.name for p in tmp_path.iterdir()] == ["out"]


# ------------------------------------------------------------------ the command on a real export
def run_serving(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "serving", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def kserve_out(resnet18_export, tmp_path_factory):
    out = tmp_path_factory.mktemp("deploy") / "kserve"
    done = run_serving("kserve", str(out), "--export-dir", str(resnet18_export["out"]),
                       "--model-store", str(resnet18_export["model_store"]))
    assert done.returncode == 0, done.stderr
    return out


@pytest.mark.slow
def test_kserve_command_writes_a_valid_layout(kserve_out, resnet18_export):
    archive = (resnet18_export["model_store"] / "resnet.mar").read_bytes()
    source = "bench-results/results.json" if (ROOT / "bench-results" / "results.json").is_file() else \
        "measured in this project"
    for device in ("gpu", "cpu"):
        storage = kserve_out / device / "storage"
        assert sorted(p.relative_to(storage).as_posix() for p in storage.rglob("*") if p.is_file()) == \
            ["config/config.properties", "model-store/resnet.mar"]
        assert (storage / "model-store" / "resnet.mar").read_bytes() == archive
        assert properties((storage / "config" / "config.properties").read_text())["enable_envvars_config"] == "true"
        text = (kserve_out / device / "inferenceservice.yaml").read_text()
        assert re.search(r"^# Autoscaling target \(scaleTarget\) from: .*" + re.escape(source), text, re.M)
        (document,) = yaml.safe_load_all(text)
        model = validate_inference_service(document).spec.predictor.model
        assert model.model_format.name == "pytorch" and model.storage_uri == f"pvc://vision-export-models/resnet-{device}"
    for document in yaml.safe_load_all((kserve_out / "storage-pvc.yaml").read_text()):
        validate_kubernetes(document)


@pytest.mark.slow
def test_kserve_command_refuses_a_non_empty_out_without_force(kserve_out, resnet18_export):
    args = ("kserve", str(kserve_out), "--export-dir", str(resnet18_export["out"]),
            "--model-store", str(resnet18_export["model_store"]))
    again = run_serving(*args)
    assert again.returncode == 1 and "not empty" in again.stderr and "--force" in again.stderr
    assert "Traceback" not in again.stderr
    (kserve_out / "stale.txt").write_text("from an earlier run")
    forced = run_serving(*args, "--force")
    assert forced.returncode == 0, forced.stderr
    assert not (kserve_out / "stale.txt").exists() and (kserve_out / "cpu" / "inferenceservice.yaml").is_file()


def test_kserve_command_explains_a_missing_export(tmp_path):
    done = run_serving("kserve", str(tmp_path / "out"), "--export-dir", str(tmp_path / "nowhere"))
    assert done.returncode == 1 and "python -m export resnet" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()
