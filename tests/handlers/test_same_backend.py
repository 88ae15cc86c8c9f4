"""Parity and the TorchServe handler provably run the same backend code: with the registry's ONNX entry
replaced by a recording subclass, both the export's parity and the handler go through it."""

import json
from pathlib import Path

import pytest
from ts.context import Context, RequestProcessor

from export.pipeline import ExportOptions, Progress, export_model
from handlers.image_classifier import TorchServeHandler
from models.user_module import user_entry
from runtime.base import BACKENDS
from tests.runtime import spy

pytestmark = pytest.mark.slow
USER_FILE = Path(__file__).parents[1] / "export" / "user_models" / "models_for_tests.py"
CAT = Path(__file__).parents[2] / "examples" / "cat.jpg"


@pytest.fixture
def spying(monkeypatch):
    monkeypatch.setitem(BACKENDS, "onnx", "tests.runtime.spy:SpyOnnxBackend")
    spy.OPENED.clear()
    spy.PREDICTED.clear()
    yield spy


def test_parity_runs_through_the_registry(spying, tmp_path):
    entry = user_entry(f"{USER_FILE}:plain", (1, 3, 16, 16))
    onnx_kinds = ["onnx-traced", "onnx-scripted", "onnx-dynamo"]  # (and what they are made from)
    export_model(entry, ExportOptions(tmp_path / "out", "random", formats=onnx_kinds), Progress(quiet=True))
    assert {name for name, _ in spying.OPENED} == {"onnx-traced", "onnx-scripted", "onnx-dynamo"}
    assert {"onnx-traced", "onnx-scripted", "onnx-dynamo"} <= set(spying.PREDICTED)


def test_the_handler_runs_through_the_registry(spying, resnet18_unpacked):
    import yaml
    config = yaml.safe_load((resnet18_unpacked / "model-config.yaml").read_text())
    mar_manifest = json.loads((resnet18_unpacked / "MAR-INF" / "MANIFEST.json").read_text())  # TorchServe's, not ours
    context = Context("resnet18", str(resnet18_unpacked), mar_manifest, batch_size=1, gpu=None, mms_version="0.12.0",
                      model_yaml_config=config)
    context.request_processor = [RequestProcessor({})]
    handler = TorchServeHandler()
    handler.initialize(context)
    response = handler.handle([{"body": CAT.read_bytes()}], context)[0]
    assert len(response["predictions"]) == 5
    assert spying.OPENED == [("onnx-dynamo", "model.dynamo.onnx")]
    assert spying.PREDICTED == ["onnx-dynamo", "onnx-dynamo"]  # the warm-up at open (handlers/core.py), the request
