"""The example clients: the v2 client's input row is the handler's own, read through the contract; the
TorchServe and KServe clients default to the archive the default export writes."""

from __future__ import annotations

import pytest
import torch

from contract.handler_config import read_labels
from contract.records import Manifest
from examples.clients import DEFAULT_MODEL, kserve_v1_client, torchserve_client, v2_client
from handlers.core import ImageCore
from models.resnet import DEFAULT_ARCH
from runtime import open_artifact
from tests.conftest import ROOT

CAT = ROOT / "examples" / "cat.jpg"


def test_clients_default_to_the_default_exports_archive_name():
    assert DEFAULT_MODEL == DEFAULT_ARCH  # python -m export resnet writes DEFAULT_ARCH.mar
    assert torchserve_client.predict.__defaults__[0] == kserve_v1_client.predict.__defaults__[0] == DEFAULT_MODEL


@pytest.mark.slow
def test_the_v2_clients_row_and_answer_are_the_handlers(resnet18_export):
    out = resnet18_export["out"]
    manifest = Manifest.read(out)
    core = ImageCore.from_folder(out, threads=torch.get_num_threads())
    tensor = v2_client.input_tensor(CAT, manifest)
    assert tensor.shape == (1, 3, *manifest.input.image_contract().crop) and str(tensor.dtype) == "float32"
    expected = core.answer(CAT.read_bytes())
    record = manifest.served_record()
    logits = open_artifact(record.format, out / record.path)(torch.from_numpy(tensor))[0].numpy()
    top5 = v2_client.top_k(logits, read_labels(out / manifest.output.labels))
    assert [(p["index"], p["label"]) for p in top5] == [(p["index"], p["label"]) for p in expected["predictions"]]
    assert [p["probability"] for p in top5] == pytest.approx([p["probability"] for p in expected["predictions"]],
                                                             abs=1e-5)
    assert v2_client.export_folder(out / "manifest.json") == out and v2_client.export_folder(out) == out
