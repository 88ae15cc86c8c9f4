"""The handler inside a real ts.context.Context, on the archive the export command built."""

import io
import json
import shutil
import zipfile

import pytest
import torch
import yaml
from PIL import Image
from ts.context import Context, RequestProcessor

import models
from runtime.images import decode_image, preprocess
from handlers.image_classifier import HandlerSetupError, ImageClassifier, select_device
from runtime import RunOptions, open_artifact
from runtime.onnxruntime import CUDA_PROVIDER, OnnxRuntimeBackend
from runtime.torchscript import TorchScriptBackend

pytestmark = pytest.mark.slow


def _jpeg(color=(200, 120, 40), size=(300, 200)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, "JPEG")
    return buffer.getvalue()


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.radial_gradient("L").convert("RGB").save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def model_dir(resnet18_export, tmp_path_factory):
    folder = tmp_path_factory.mktemp("unpacked")
    with zipfile.ZipFile(resnet18_export["model_store"] / "resnet.mar") as archive:
        archive.extractall(folder)
    return folder


def _context(model_dir, rows, headers=None, config_overrides=None):
    config = yaml.safe_load((model_dir / "model-config.yaml").read_text())
    for key, value in (config_overrides or {}).items():
        config["handler"][key] = value
    manifest = json.loads((model_dir / "MAR-INF" / "MANIFEST.json").read_text())
    context = Context("resnet", str(model_dir), manifest, batch_size=len(rows), gpu=None, mms_version="0.12.0",
                      model_yaml_config=config)
    context.request_processor = [RequestProcessor((headers or {}).get(i, {})) for i in range(len(rows))]
    return context


def _handler(model_dir, rows, **kwargs):
    context = _context(model_dir, rows, **kwargs)
    handler = ImageClassifier()
    handler.initialize(context)
    return handler, context


def test_batch_with_one_bad_image_answers_each_request(model_dir):
    rows = [{"body": bytearray(_jpeg())}, {"body": bytearray(b"definitely not an image")},
            {"data": bytearray(_png())}]
    handler, context = _handler(model_dir, rows, headers={2: {"X-TopK": "2"}})
    responses = handler.handle(rows, context)
    assert len(responses[0]["predictions"]) == 5 and len(responses[2]["predictions"]) == 2
    assert responses[1] == {"code": 415, "error": responses[1]["error"]} and "JPEG" in responses[1]["error"]
    assert [context.get_response_status(i)[0] for i in range(3)] == [200, 415, 200]
    top = responses[0]["predictions"]
    assert all(set(p) == {"label", "index", "probability"} for p in top)
    assert [p["probability"] for p in top] == sorted((p["probability"] for p in top), reverse=True)


def test_predictions_match_the_eager_model(model_dir):
    body = _jpeg((30, 160, 90))
    handler, context = _handler(model_dir, [{"body": body}])
    response = handler.handle([{"body": body}], context)[0]
    with torch.inference_mode():
        eager = models.get("resnet18").build("random").module.eval()
        probabilities = torch.softmax(eager(preprocess(decode_image(body), handler.contract)[None]), dim=1)[0]
    values, indices = probabilities.topk(5)
    assert [p["index"] for p in response["predictions"]] == indices.tolist()
    labels = json.loads((model_dir / "index_to_name.json").read_text())
    assert response["predictions"][0]["label"] == labels[str(indices[0].item())]
    assert response["predictions"][0]["probability"] == pytest.approx(values[0].item(), abs=1e-4)


def test_torchscript_backend_is_chosen_by_model_config(model_dir, resnet18_export, tmp_path):
    folder = tmp_path / "ts"
    shutil.copytree(model_dir, folder)
    shutil.copy2(resnet18_export["out"] / "model.scripted.pt", folder)
    handler, context = _handler(folder, [{}], config_overrides={"artifact": "scripted"})
    assert type(handler.backend) is TorchScriptBackend
    onnx_handler, _ = _handler(model_dir, [{}])  # the archive's own choice: onnx-dynamo
    assert type(onnx_handler.backend) is OnnxRuntimeBackend and onnx_handler.artifact == "onnx-dynamo"
    body = _jpeg()
    assert handler.handle([{"body": body}], context)[0]["predictions"][0]["index"] == \
        onnx_handler.handle([{"body": body}], _context(model_dir, [{}]))[0]["predictions"][0]["index"]


def test_unknown_artifact_in_config_is_a_clear_error(model_dir):
    with pytest.raises(HandlerSetupError, match="handler.artifact='nope' is not in the manifest"):
        _handler(model_dir, [{}], config_overrides={"artifact": "nope"})


def test_device_selection_with_cuda_check_patched(monkeypatch, model_dir):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    context = _context(model_dir, [{}])
    context.system_properties["gpu_id"] = 3
    assert select_device(context.system_properties) == torch.device("cuda:3")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine: GPU path not exercised")
def test_gpu_backends_match_cpu(resnet18_export):
    x = torch.rand(2, 3, 224, 224)
    scripted = resnet18_export["out"] / "model.scripted.pt"
    cpu = open_artifact("torchscript", scripted).predict(x)
    gpu = open_artifact("torchscript", scripted, RunOptions(device="cuda:0")).predict(x)
    torch.testing.assert_close(gpu, cpu, atol=1e-3, rtol=1e-3)
    half = open_artifact("torchscript", scripted, RunOptions(device="cuda:0", precision="fp16"))
    assert (half.predict(x).argmax(1) == cpu.argmax(1)).all()
    ort_gpu = open_artifact("onnx", resnet18_export["out"] / "model.dynamo.onnx", RunOptions(device="cuda:0"))
    assert CUDA_PROVIDER in ort_gpu.session.get_providers()
    torch.testing.assert_close(ort_gpu.predict(x), cpu, atol=1e-3, rtol=1e-3)
