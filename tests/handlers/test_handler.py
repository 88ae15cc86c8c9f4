"""The TorchServe adapter inside a real ts.context.Context, on the archive the export command built: it maps
rows, headers, statuses and set-up failures onto the core, and answers what the core answers in-process."""

import io
import json
import logging
import shutil

import pytest
import torch
import yaml
from PIL import Image
from prometheus_client import REGISTRY
from ts.context import Context, RequestProcessor

from contract.records import ContractError, Manifest
from contract.versions import VERSION_HEADER
from handlers.image_classifier import ID_HEADER, TorchServeHandler, select_device, torchserve_request
from runtime import IntegrityError, RunOptions, open_artifact
from runtime.onnxruntime import CUDA_PROVIDER
from tests.answers import assert_same_answer, expected_answer

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
def model_dir(resnet18_unpacked):
    return resnet18_unpacked


def _context(model_dir, rows, headers=None, config_overrides=None, name="resnet18"):
    config = yaml.safe_load((model_dir / "model-config.yaml").read_text())
    config["handler"].update(config_overrides or {})
    mar_manifest = json.loads((model_dir / "MAR-INF" / "MANIFEST.json").read_text())  # TorchServe's, not ours
    context = Context(name, str(model_dir), mar_manifest, batch_size=len(rows), gpu=None,
                      mms_version="0.12.0", model_yaml_config=config)
    context.request_processor = [RequestProcessor((headers or {}).get(i, {})) for i in range(len(rows))]
    return context


def _handler(model_dir, rows, **kwargs):
    context = _context(model_dir, rows, **kwargs)
    handler = TorchServeHandler()
    handler.initialize(context)
    return handler, context


def test_batch_with_one_bad_image_answers_each_request_with_its_status(model_dir):
    rows = [{"body": bytearray(_jpeg())}, {"body": bytearray(b"definitely not an image")},
            {"data": bytearray(_png())}]
    handler, context = _handler(model_dir, rows, headers={2: {"X-TopK": "2"}})
    responses = handler.handle(rows, context)
    assert len(responses[0]["predictions"]) == 5 and len(responses[2]["predictions"]) == 2
    assert responses[1] == {"code": 415, "error": responses[1]["error"], "request_id": responses[1]["request_id"]}
    assert "JPEG" in responses[1]["error"] and responses[1]["request_id"]  # the id its X-Request-ID header carries
    assert [context.get_response_status(i)[0] for i in range(3)] == [200, 415, 200]
    assert_same_answer(responses[0], expected_answer(model_dir, _jpeg()))
    assert_same_answer(responses[2], expected_answer(model_dir, _png(), topk=2))


def test_a_model_served_under_its_own_name_is_named_so_in_answers_headers_and_metrics(model_dir):
    """resnet18.mar registered as clf (TorchServe's model name): its answers, description and metric labels say clf,
    the architecture is a field of its own, and every row, an error too, carries its version and id headers."""
    rows = [{"body": bytearray(_jpeg())}, {"body": bytearray(b"definitely not an image")}]
    handler, context = _handler(model_dir, rows, name="clf")
    labels = {**handler.core.served.labels(), "code": "200"}
    before = REGISTRY.get_sample_value("vision_request_duration_seconds_count", labels) or 0.0
    failed = REGISTRY.get_sample_value("vision_request_failures_total", {**labels, "code": "415"}) or 0.0
    answer, error = handler.handle(rows, context)
    assert (answer["model"], answer["architecture"]) == ("clf", "resnet18") and labels["model"] == "clf"
    assert {key: handler.core.describe()[key] for key in ("model", "architecture")} == {
        "model": "clf", "architecture": "resnet18"}
    assert REGISTRY.get_sample_value("vision_request_duration_seconds_count", labels) == before + 1
    assert REGISTRY.get_sample_value("vision_request_failures_total", {**labels, "code": "415"}) == failed + 1
    for index in range(2):
        headers = context.get_response_headers(index)
        assert headers[VERSION_HEADER] == answer["version"] and headers[ID_HEADER]
    assert error["request_id"] == context.get_response_headers(1)[ID_HEADER]


def test_the_archives_answer_is_the_in_process_answer(model_dir, resnet18_export):
    body = _jpeg((30, 160, 90))
    handler, context = _handler(model_dir, [{"body": body}])
    served = handler.handle([{"body": body}], context)[0]
    assert_same_answer(served, expected_answer(resnet18_export["archive"], body))
    assert_same_answer(served, expected_answer(resnet18_export["out"], body))  # the export folder serves the same


def test_an_artifact_key_in_model_config_is_refused_naming_it(model_dir, caplog):
    with caplog.at_level(logging.ERROR), pytest.raises(ContractError, match="unknown artifact"):
        _handler(model_dir, [{}], config_overrides={"artifact": "scripted"})
    assert "cannot serve this archive: model-config.yaml handler: unknown artifact" in caplog.text


def test_a_tampered_artifact_is_refused_with_the_line_serving_looks_for(model_dir, tmp_path, caplog):
    folder = tmp_path / "tampered"
    shutil.copytree(model_dir, folder)
    served = folder / Manifest.read(folder).served_record().path
    served.write_bytes(served.read_bytes()[:-10])
    with caplog.at_level(logging.ERROR), pytest.raises(IntegrityError):
        _handler(folder, [{}])
    refusals = [r.getMessage() for r in caplog.records if r.getMessage().startswith("REFUSING TO SERVE: ")]
    assert len(refusals) == 1 and served.name in refusals[0] and "but the manifest records" in refusals[0]


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


def test_torchserves_rows_become_the_cores_request_record():
    """What TorchServe hands a handler (a parsed JSON body, a decoded text body, a form's fields, headers with each
    part's content type as a dict) becomes one ImageRequest; X-Request-ID's id else TorchServe's own."""
    rows = [{"body": {"data": "aGk=", "topk": 2}}, {"body": "aGk="}, {"body": bytearray(b"\xff\xd8")},
            {"file": b"\xff\xd8", "topk": b"3"}, {"body": [1, 2]}]
    headers = {0: {"X-Request-ID": "abc-1", "body": {"content-type": "application/json"}},
               1: {"body": {"content-type": "text/plain"}}, 2: {"Content-Type": "image/jpeg", "X-TopK": "4"}}
    context = Context("m", ".", {}, batch_size=len(rows), gpu=None, mms_version="0.12.0")
    context.request_processor = [RequestProcessor(headers.get(i, {})) for i in range(len(rows))]
    context.request_ids = {i: f"ts-{i}" for i in range(len(rows))}
    made = [torchserve_request(context, index, row) for index, row in enumerate(rows)]
    assert [r.request_id for r in made] == ["abc-1", "ts-1", "ts-2", "ts-3", "ts-4"]
    assert made[0].is_json and made[0].fields == {"data": "aGk=", "topk": 2} and made[0].body == b""
    assert made[1].content_type == "text/plain" and made[1].body == b"aGk="
    assert made[2].body == b"\xff\xd8" and made[2].content_type == "image/jpeg" and made[2].header("x-topk") == "4"
    assert made[3].fields == {"file": b"\xff\xd8", "topk": b"3"} and made[3].body == b""
    assert made[4].is_json and made[4].body == b"[1, 2]"
