"""KServe's own ModelServer (a subprocess on 127.0.0.1) serving the .mar that `python -m export resnet` built,
through our request core, called by clients no one here wrote: `requests` for v1 and `tritonclient.http` for
v2 (binary data and JSON). Every answer is compared with the same artifact run in-process on the same image
(tests/answers.py), one test compares it with a real TorchServe's, and the bad-input matrix of the TorchServe
path (tests/e2e/test_bad_input.py) gets the same statuses and reasons here."""

from __future__ import annotations

import base64
import concurrent.futures
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import requests
import tritonclient.http as triton

from contract.policy import PolicyChoices
from contract.records import Manifest
from serving.kserve.config import KServeSettings
from serving.kserve.engine import KServe
from serving.processes import group_alive
from serving.settings import ServingError, free_port
from serving.torchserve.config import on_free_ports
from serving.torchserve.engine import TorchServe
from tests.answers import assert_same_answer
from tests.conftest import ROOT
from tests.e2e.test_bad_input import CASES, JPEG, OK

pytestmark = pytest.mark.slow
CAT = ROOT / "examples" / "cat.jpg"
# One worker that batches: concurrent requests share a batch (the archive pins the delay, 40 ms).
BATCHING = PolicyChoices(workers=1, batch_size=4, threads_per_worker=2)
# Where KServe's wire differs from TorchServe's for the same body (TorchServe decodes text/* bodies to text).
KSERVE_OUTCOMES = {"text/html": (415, "not an image")}


@pytest.fixture(scope="module")
def served(resnet18_export, tmp_path_factory):
    settings = KServeSettings(resnet18_export["model_store"], (resnet18_export["model_name"],),
                              http_port=free_port(), run_dir=tmp_path_factory.mktemp("kserve"), flags=BATCHING)
    with KServe(settings).running(CAT) as process:
        yield settings, process
    assert not group_alive(process.pid), "KServe processes survived stop()"


@pytest.fixture(scope="module")
def settings(served) -> KServeSettings:
    return served[0]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def predict(settings, body: dict) -> requests.Response:
    return requests.post(settings.predict_url("resnet18"), json=body, timeout=60)


# ---------------------------------------------------------------- v1
def test_v1_answers_as_the_artifact_in_process(settings, expect):
    response = predict(settings, {"instances": [{"image": {"b64": b64(CAT.read_bytes())}}]})
    assert response.status_code == 200, response.text
    (answer,) = response.json()["predictions"]
    assert_same_answer(answer, expect(CAT.read_bytes()))


def test_v1_several_instances_each_with_its_topk(settings, expect):
    png = CASES["RGBA"][0]
    body = {"instances": [{"image": {"b64": b64(CAT.read_bytes())}, "topk": 2}, {"data": b64(png)}]}
    response = predict(settings, body)
    assert response.status_code == 200, response.text
    first, second = response.json()["predictions"]
    assert_same_answer(first, expect(CAT.read_bytes(), 2))
    assert_same_answer(second, expect(png))


@pytest.mark.parametrize("body,words", [
    ({"instances": []}, "no instances"),
    ({"instances": [{"image": {"b64": "@@"}}]}, "not valid base64"),
    ({"instances": [{"picture": "x"}]}, "instance 0 has no base64 image"),
    ({"instances": [42]}, "instance 0 is a JSON int"),
    ({"instances": [{"image": {"b64": b64(CAT.read_bytes())}, "topk": 0}]}, "topk"),
])
def test_v1_bad_bodies_are_400_with_the_reason(settings, body, words):
    response = predict(settings, body)
    assert response.status_code == 400 and words in response.json()["error"], response.text


def test_one_bad_instance_names_its_row(settings):
    body = {"instances": [{"image": {"b64": b64(CAT.read_bytes())}}, {"image": {"b64": b64(b"not an image")}}]}
    response = predict(settings, body)
    assert response.status_code == 415 and response.json()["error"].startswith("image 1: "), response.text


# ---------------------------------------------------------------- the TorchServe path's bad-input matrix
@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_matrix_as_on_the_torchserve_path(settings, case):
    body, headers, expected = CASES[case]
    response = requests.post(settings.predict_url("resnet18"), data=body, headers=headers, timeout=60)
    status, words = KSERVE_OUTCOMES.get(case, expected)
    assert response.status_code == status, f"{response.status_code}: {response.text[:300]}"
    answer = response.json()
    if status == 200:
        assert answer["predictions"][0]["model"] == "resnet18"
    else:
        assert answer == {"code": status, "error": answer["error"]} and (words or "") in answer["error"]


def test_bad_and_good_requests_interleaved_are_batched_and_the_server_survives(served, expect):
    settings, process = served
    bad = [CASES[c] for c in ("random bytes", "truncated JPEG", "JSON array", "topk abc", "1x1 image")]
    jobs = [(CAT.read_bytes(), JPEG, OK) if i % 2 == 0 else bad[i // 2 % len(bad)] for i in range(24)]
    log_size = settings.log_file.stat().st_size
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda job: requests.post(settings.predict_url("resnet18"), data=job[0],
                                                            headers=job[1], timeout=60), jobs))
    for (body, _, (status, _)), response in zip(jobs, responses):
        assert response.status_code == status, response.text
        if status == 200:
            assert_same_answer(response.json()["predictions"][0], expect(body))
    assert process.poll() is None
    batches = [int(line.split("batch of ")[1].split(":")[0]) for line in
               settings.log_file.read_text()[log_size:].splitlines() if "batch of " in line]
    assert max(batches) > 1, f"concurrent requests were never batched: {batches}"


# ---------------------------------------------------------------- v2, with tritonclient
@pytest.fixture(scope="module")
def client(settings):
    return triton.InferenceServerClient(f"{settings.host}:{settings.http_port}")


def _infer(client, images: list, binary: bool, topk: int = 5):
    tensor = triton.InferInput("image", [len(images)], "BYTES")
    values = images if binary else [b64(image) for image in images]
    tensor.set_data_from_numpy(np.array(values, dtype=np.object_), binary_data=binary)
    outputs = [triton.InferRequestedOutput(name, binary_data=binary) for name in ("labels", "indices", "probabilities")]
    return client.infer("resnet18", [tensor], outputs=outputs, parameters={"topk": topk})


@pytest.mark.parametrize("binary", [True, False], ids=["binary-data", "json"])
def test_v2_answers_as_the_artifact_in_process(client, expect, binary):
    png = CASES["RGBA"][0]
    result = _infer(client, [CAT.read_bytes(), png], binary, topk=3)
    labels, indices, probabilities = (result.as_numpy(n) for n in ("labels", "indices", "probabilities"))
    assert labels.shape == indices.shape == probabilities.shape == (2, 3)
    assert result.get_response()["parameters"] == {"model": "resnet18", "artifact": expect(png)["artifact"]}
    for row, image in enumerate([CAT.read_bytes(), png]):
        served = {"model": "resnet18", "artifact": expect(image)["artifact"], "predictions": [
            {"label": label.decode() if isinstance(label, bytes) else label, "index": int(index),
             "probability": float(p)} for label, index, p in zip(labels[row], indices[row], probabilities[row])]}
        assert_same_answer(served, expect(image, 3))


def test_v2_metadata_and_readiness_as_kserve_documents_them(client, settings):
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("resnet18")
    metadata = client.get_model_metadata("resnet18")
    assert metadata["name"] == "resnet18"
    assert metadata["inputs"] == [{"name": "image", "datatype": "BYTES", "shape": [-1]}]
    assert [o["name"] for o in metadata["outputs"]] == ["labels", "indices", "probabilities"]
    assert requests.get(f"{settings.url}/v1/models/resnet18", timeout=10).json() == {"name": "resnet18", "ready": True}
    assert requests.get(f"{settings.url}/v1/models", timeout=10).json() == {"models": ["resnet18"]}


def test_the_model_description_says_which_form_serves_here_and_why(settings, resnet18_export):
    served = Manifest.read(resnet18_export["out"]).serving.served
    described = requests.get(f"{settings.url}/v2/models/resnet18/description", timeout=10)
    assert described.status_code == 200, described.text
    assert described.json()["artifact"] == served and described.json()["why"].startswith(f"serving {served} on ")
    # the model's serving policy as resolved by the engine and read from its run config, each value's reason
    assert described.json()["policy"] == settings.policies["resnet18"].describe()
    assert {"workers 1: --workers", "batch size 4: --batch-size", "batch delay 40 ms: the archive pins it",
            "threads 2: --threads"} == set(described.json()["policy"]["why"])
    assert requests.get(f"{settings.url}/v2/models/nothing/description", timeout=10).status_code == 404


def test_v2_bad_requests_are_400_with_the_reason(client):
    wrong = triton.InferInput("pixels", [1], "BYTES")
    wrong.set_data_from_numpy(np.array([CAT.read_bytes()], dtype=np.object_))
    with pytest.raises(triton.InferenceServerException, match=r"\[400\].*BYTES input named \"image\""):
        client.infer("resnet18", [wrong])
    with pytest.raises(triton.InferenceServerException, match=r"\[415\].*not an image"):
        _infer(client, [b"not an image"], binary=True)
    with pytest.raises(triton.InferenceServerException, match=r"\[400\].*topk"):
        _infer(client, [CAT.read_bytes()], binary=True, topk=0)


# ---------------------------------------------------------------- the same answers as TorchServe's
def test_same_answer_as_torchserve_on_the_same_photo(settings, resnet18_export, tmp_path):
    ts_settings = on_free_ports(resnet18_export["model_store"], tmp_path / "torchserve")
    ts_settings.model_name = "resnet18"
    with TorchServe(ts_settings).running(CAT):
        from_torchserve = requests.post(ts_settings.predictions_url(), data=CAT.read_bytes(), headers=JPEG,
                                        timeout=60).json()
    from_kserve = predict(settings, {"instances": [{"image": {"b64": b64(CAT.read_bytes())}}]}).json()
    assert_same_answer(from_kserve["predictions"][0], from_torchserve, atol=0)


# ---------------------------------------------------------------- the command, and refusing to serve
def test_serving_command_detach_then_stop(resnet18_export, tmp_path):
    run_dir, port = tmp_path / "run", str(free_port())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = subprocess.run([sys.executable, "-m", "serving", "--engine", "kserve", "--detach", "--model-store",
                              str(resnet18_export["model_store"]), "--run-dir", str(run_dir), "--inference-port",
                              port, "--workers", "1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    pgid = int((run_dir / "kserve.pgid").read_text()) if (run_dir / "kserve.pgid").exists() else None
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"http://127.0.0.1:{port}/v1/models/resnet18:predict" in started.stdout
        assert "sha256 verified" in (run_dir / "logs" / "kserve.log").read_text()
        # (the policy's worker processes: tests/docker/test_entrypoint.py, which starts the default policy)
    finally:
        # a plain stop: it finds the KServe server by its pid file (--engine kserve is accepted too)
        stopped = subprocess.run([sys.executable, "-m", "serving", "stop", "--run-dir", str(run_dir)], cwd=ROOT,
                                 env=env, capture_output=True, text=True, timeout=120)
    assert stopped.stdout == "the KServe server stopped\n", stopped.stdout + stopped.stderr
    assert pgid is not None and not group_alive(pgid)


def test_a_tampered_archive_is_refused_with_the_cores_reason(resnet18_export, tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    with zipfile.ZipFile(resnet18_export["archive"]) as source, \
            zipfile.ZipFile(store / "resnet18.mar", "w") as target:
        for info in source.infolist():
            data = source.read(info)
            target.writestr(info, data[:-1] + bytes([data[-1] ^ 1]) if info.filename.endswith(".onnx") else data)
    settings = KServeSettings(store, ("resnet18",), http_port=free_port(), run_dir=tmp_path / "run")
    with pytest.raises(ServingError, match="sha256"):
        with KServe(settings).running(CAT, timeout=120):
            pass
