"""A trained ImageNet model end to end: `python -m export efficientnet --precision fp32,int8` on the packaged
EfficientNet-Lite0 weights. Real photographs get their class in the top 5 from every artifact (eager, traced,
scripted, legacy ONNX, int8) and from the served endpoint, whose answer equals the form it names run in-process
(the one measured fastest at load among the gated); int8 passes the accuracy gate and is declared first."""

from __future__ import annotations

import pytest
import requests
import torch

from contract.handler_config import read_labels
from runtime import RunOptions, open_artifact
from runtime.images import decode_upright, preprocess
from serving.torchserve import server
from tests.answers import assert_same_answer, expected_answer
from tests.conftest import LITE0_FORMATS
from tests.photos import EXPECTED_CLASSES, photo_jpeg, top5_labels

pytestmark = pytest.mark.slow
MODEL = "efficientnet-lite0"


@pytest.fixture(scope="module")
def lite0_export(lite0_int8_export) -> dict:
    return lite0_int8_export


def test_the_export_is_of_the_trained_weights_with_their_transform(lite0_export):
    manifest = lite0_export["manifest"]
    assert manifest.weights["kind"] == "imagenet" and len(manifest.weights["sha256"]) == 64
    contract = manifest.input.preprocessing
    assert (contract.resize, contract.crop, contract.interpolation) == (256, (224, 224), "bicubic")


def test_int8_passes_the_gate_and_is_served(lite0_export):
    manifest = lite0_export["manifest"]
    assert manifest.precision["gate"]["onnx-int8"] == "passed", manifest.precision
    assert manifest.decision().served_kind() == "onnx-int8"


def test_every_artifact_puts_each_photo_class_in_its_top5(lite0_export):
    manifest, folder = lite0_export["manifest"], lite0_export["out"]
    labels = read_labels(folder / "index_to_name.json")
    names = [labels[index] for index in range(len(labels))]
    rows = {photo: preprocess(decode_upright(photo_jpeg(photo)), manifest.input.preprocessing)
            for photo in EXPECTED_CLASSES}
    batch = torch.stack(list(rows.values()))
    assert set(LITE0_FORMATS.split(",")) | {"onnx-int8"} == set(manifest.artifacts)
    for kind, record in manifest.artifacts.items():
        backend = open_artifact(record.format, folder / record.path, RunOptions(precision=record.run_precision))
        logits = backend(batch)
        for index, (photo, expected) in enumerate(EXPECTED_CLASSES.items()):
            top5 = top5_labels(logits[index], names)
            assert expected & set(top5), f"{kind} on {photo}: top 5 {top5}, expected one of {sorted(expected)}"


def test_the_endpoint_answers_each_photo_with_its_class_as_the_artifact_does(lite0_export, tmp_path):
    settings = server.on_free_ports(lite0_export["store"], tmp_path / "run")
    settings.model_name = MODEL
    with server.running(settings):
        for photo, expected in EXPECTED_CLASSES.items():
            image = photo_jpeg(photo)
            response = requests.post(settings.predictions_url(), data=image,
                                     headers={"Content-Type": "image/jpeg"}, timeout=60)
            assert response.status_code == 200, response.text
            body = response.json()
            assert_same_answer(body, expected_answer(lite0_export["archive"], image))
            top5 = [p["label"] for p in body["predictions"]]
            assert expected & set(top5), f"{photo}: {body}"
