"""`python -m serving deploy kserve|triton` on a real export, validated with real schemas, and a client for each
deployment: TorchServe and KServe v1 against a local TorchServe, v2 against tritonclient's own helpers and
the repository's model run in ONNX Runtime (no Triton server or cluster can run here)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort
import pytest
import requests
import yaml

from contract.handler_config import read_labels
from contract.records import Manifest
from examples.clients import kserve_v1_client, torchserve_client, v2_client
from serving.torchserve import server
from serving.torchserve.config import DEFAULT_CONFIG, on_free_ports
from tests.answers import assert_same_answer, expected_answer
from tests.conftest import ROOT
from tests.serving.schemas import parse_model_config, validate_inference_service, validate_kubernetes

pytestmark = pytest.mark.slow
CAT = ROOT / "examples" / "cat.jpg"


def run_serving(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "serving", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def kserve_out(resnet18_export, tmp_path_factory):
    out = tmp_path_factory.mktemp("deploy") / "kserve"
    done = run_serving("deploy", "kserve", str(out), "--export-dir", str(resnet18_export["out"]),
                       "--model-store", str(resnet18_export["model_store"]))
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def triton_out(resnet18_export, tmp_path_factory):
    out = tmp_path_factory.mktemp("deploy") / "triton"
    done = run_serving("deploy", "triton", str(out), "--export-dir", str(resnet18_export["out"]))
    assert done.returncode == 0, done.stderr
    return out


def test_kserve_storage_layout_and_objects_validate(kserve_out, resnet18_export):
    archive, name = resnet18_export["archive"], resnet18_export["model_name"]  # named after the model
    for device in ("gpu", "cpu"):
        storage = kserve_out / device / "storage"
        assert (storage / "model-store" / archive.name).read_bytes() == archive.read_bytes()
        assert "enable_envvars_config=true" in (storage / "config" / "config.properties").read_text()
        (service,) = yaml.safe_load_all((kserve_out / device / "inferenceservice.yaml").read_text())
        model = validate_inference_service(service).spec.predictor.model
        assert model.model_format.name == "pytorch" and model.storage_uri.endswith(f"{name}-{device}")
    for document in yaml.safe_load_all((kserve_out / "storage-pvc.yaml").read_text()):
        validate_kubernetes(document)


def test_kserve_engine_storage_layout_and_service_validate(kserve_out, resnet18_export):
    """kserve-engine/: the archive where the entrypoint (ENGINE=kserve) serves it from, and its InferenceService."""
    archive, name = resnet18_export["archive"], resnet18_export["model_name"]
    folder = kserve_out / "kserve-engine"
    assert (folder / "storage" / "model-store" / archive.name).read_bytes() == archive.read_bytes()
    (service,) = yaml.safe_load_all((folder / "inferenceservice.yaml").read_text())
    (container,) = validate_inference_service(service).spec.predictor.containers
    env = {variable.name: variable.value for variable in container.env}
    assert env["ENGINE"] == "kserve" and env["MODEL"] == name and env["STORAGE_URI"].endswith(f"{name}-kserve")


def test_refuses_to_overwrite_without_force(kserve_out, resnet18_export):
    again = run_serving("deploy", "kserve", str(kserve_out), "--export-dir", str(resnet18_export["out"]),
                        "--model-store", str(resnet18_export["model_store"]))
    assert again.returncode == 1 and "pass --force" in again.stderr and "Traceback" not in again.stderr


def test_triton_repository_matches_its_schema_and_runs_as_declared(triton_out, resnet18_export):
    manifest = Manifest.read(resnet18_export["out"])
    folder = triton_out / "model_repository" / resnet18_export["model_name"]
    config = parse_model_config((folder / "config.pbtxt").read_text())
    assert config.platform == "onnxruntime_onnx" and config.max_batch_size >= 8
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8]
    model = folder / "1" / "model.onnx"
    assert config.name == resnet18_export["model_name"]
    assert hashlib.sha256(model.read_bytes()).hexdigest() == manifest.served_record().sha256  # decided at export
    (declared_in,), (declared_out,) = config.input, config.output
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    shape = [2] + [224 if d == -1 else d for d in declared_in.dims]
    (logits,) = session.run([declared_out.name], {declared_in.name: np.random.rand(*shape).astype(np.float32)})
    assert list(logits.shape) == [2] + list(declared_out.dims)
    (service,) = yaml.safe_load_all((triton_out / "inferenceservice-triton.yaml").read_text())
    assert validate_inference_service(service).spec.predictor.model.model_format.name == "onnx"


@pytest.fixture(scope="module")
def v2_exchange(triton_out, resnet18_export):
    """Our v2 request for the example image, and what Triton would answer: the repository's model run on
    exactly that request, in v2 JSON."""
    manifest = Manifest.read(resnet18_export["out"])
    name = resnet18_export["model_name"]
    tensor = v2_client.input_tensor(CAT, manifest)
    request = v2_client.v2_request(tensor, manifest.input.name, manifest.output.name)
    session = ort.InferenceSession(str(triton_out / "model_repository" / name / "1" / "model.onnx"))
    (logits,) = session.run(None, {"input": np.asarray(request["inputs"][0]["data"], np.float32).reshape(tensor.shape)})
    response = {"model_name": name, "outputs": [{"name": "output", "datatype": "FP32",
                                                     "shape": list(logits.shape), "data": logits.flatten().tolist()}]}
    return {"tensor": tensor, "request": request, "response": response,
            "labels": read_labels(resnet18_export["out"] / manifest.output.labels)}


def test_v2_client_speaks_what_tritonclient_speaks(v2_exchange):
    from tritonclient.http import InferInput, InferRequestedOutput, InferResult
    from tritonclient.http._utils import _get_inference_request
    tensor = v2_exchange["tensor"]
    reference_input = InferInput("input", list(tensor.shape), "FP32")
    reference_input.set_data_from_numpy(tensor, binary_data=False)
    body, _ = _get_inference_request([reference_input], "", [InferRequestedOutput("output", binary_data=False)],
                                     0, False, False, 0, None, None)
    reference = json.loads(body)
    ours = v2_exchange["request"]
    assert ours["inputs"] == reference["inputs"] and ours["outputs"][0]["name"] == reference["outputs"][0]["name"]
    response = v2_exchange["response"]
    parsed = InferResult.from_response_body(json.dumps(response).encode()).as_numpy("output")
    np.testing.assert_array_equal(v2_client.logits_from_v2(response, "output"), parsed)


@pytest.fixture(scope="module")
def kserve_envelope_server(resnet18_export, tmp_path_factory):
    """Our TorchServe with KServe's v1 envelope switched on, as KServe's TorchServe runtime runs it."""
    run_dir = tmp_path_factory.mktemp("kserve-run")
    config = run_dir / "base.properties"
    config.write_text(DEFAULT_CONFIG.read_text() + "\nservice_envelope=kserve\n")
    settings = on_free_ports(resnet18_export["model_store"], run_dir)
    settings.config, settings.model_name = config, resnet18_export["model_name"]
    process = server.start(settings)
    try:
        deadline = time.monotonic() + 200
        while True:
            try:
                kserve_v1_client.predict(settings.inference_url, CAT, resnet18_export["model_name"], timeout=10)
                break
            except requests.RequestException:
                assert process.poll() is None and time.monotonic() < deadline, "TorchServe did not come up"
                time.sleep(1)
        yield settings, resnet18_export["model_name"]
    finally:
        server.stop(settings, process)


def test_kserve_v1_client_against_the_kserve_envelope(kserve_envelope_server):
    settings, name = kserve_envelope_server
    top = kserve_v1_client.predict(settings.inference_url, CAT, name)
    assert len(top) == 5 and all(set(p) == {"label", "index", "probability"} for p in top)


def test_torchserve_client_and_the_v2_path_give_the_same_answer(resnet18_export, v2_exchange, tmp_path):
    settings = on_free_ports(resnet18_export["model_store"], tmp_path / "run")
    settings.model_name = resnet18_export["model_name"]
    settings.run_dir.mkdir(parents=True)
    with server.running(settings, CAT):
        answer = torchserve_client.predict(settings.inference_url, CAT, resnet18_export["model_name"])
    assert_same_answer(answer, expected_answer(resnet18_export["archive"], CAT.read_bytes()))
    logits = v2_client.logits_from_v2(v2_exchange["response"], "output")[0]
    v2_top5 = v2_client.top_k(logits, v2_exchange["labels"])
    assert [(p["index"], p["label"]) for p in answer["predictions"]] == [(p["index"], p["label"]) for p in v2_top5]
    for served, v2 in zip(answer["predictions"], v2_top5):
        assert served["probability"] == pytest.approx(v2["probability"], abs=1e-5)
