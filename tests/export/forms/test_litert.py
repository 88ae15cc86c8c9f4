"""The litert kind through the real export command: the tests' small user model converted by litert-torch to a
`.tflite`, held to eager by parity through LiteRT's own interpreter, its input contract beside it saying the shape
and layout the interpreter reads, served by the in-process core when asked for (--serve litert). A detector whose
boxes come from torchvision's nms is refused with the converter's reason. These run where litert-torch is installed
(`make litert-env`, then `.venv-litert/bin/python -m pytest tests/export/forms/test_litert.py`); the refusal without
it runs everywhere."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch
import torchvision

from contract.records import MANIFEST_NAME, Manifest
from export.forms import kinds, litert
from export.forms.exporters import BuildContext, GraphIO
from runtime import open_artifact
from runtime.integrity import file_sha256
from tests.conftest import ROOT, export_in_process
from tests.export.user_models import PLAIN, PLAIN_SHAPE

needs_litert = pytest.mark.skipif(importlib.util.find_spec("litert_torch") is None,
                                  reason="litert-torch is not installed here: `make test` runs these next in .venv-litert "
                                         "(make litert-env)")


def export_plain(out, *extra: str):
    done = export_in_process("module", PLAIN, "--input-shape", PLAIN_SHAPE, "--formats", "traced,litert",
                             "--precision", "fp32", "--no-benchmark", "--out", str(out), *extra)
    manifest = Manifest.from_json((out / MANIFEST_NAME).read_text()) if (out / MANIFEST_NAME).is_file() else None
    return done, manifest


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("litert") / "plain"
    done, manifest = export_plain(out, "--serve", "litert")
    assert done.returncode == 0, done.stdout + done.stderr
    return {"out": out, "manifest": manifest, "stdout": done.stdout}


def test_the_litert_file_is_built_when_named_never_by_default():
    kind = kinds.get("litert")
    assert "litert" not in kinds.default_formats() and "make litert-env" in kind.off_by_default
    assert kind.for_devices and kind.serving_rank is None and "litert" not in kinds.serving_preference()


@needs_litert
def test_the_file_passes_parity_through_litert_interpreter(export):
    manifest, out = export["manifest"], export["out"]
    record = manifest.artifacts["litert"]
    assert (record.path, record.format, record.precision) == ("model.tflite", "litert", "fp32")
    assert manifest.parity["summary"]["litert"]["passed"] and "litert ok" in export["stdout"]
    backend = open_artifact("litert", out / record.path)
    assert type(backend).__name__ == "LiteRTBackend" and backend.describe()["input_shape"] == [1, 3, 32, 32]


@needs_litert
def test_its_input_contract_is_beside_it_hashed_with_it_and_says_what_the_interpreter_reads(export):
    out, record = export["out"], export["manifest"].artifacts["litert"]
    assert record.companions == {"model.litert.json": file_sha256(out / "model.litert.json")}
    contract = json.loads((out / "model.litert.json").read_text())
    assert (contract["model"], contract["signature"], contract["precision"]) == ("model.tflite", "serving_default",
                                                                              "fp32")
    assert contract["input"]["shape"] == [1, 3, 32, 32] and contract["input"]["layout"] == "NCHW"
    assert contract["input"]["name"] == backend_input(out) and contract["signature_outputs"] == ["output_0"]
    assert contract["input"]["normalisation"].startswith("in the graph")
    assert contract["preprocessing"]["centre_crop"] == [32, 32]
    assert contract["bytes"] == (out / "model.tflite").stat().st_size
    assert contract["latency_ms_batch1"]["threads_1"] > 0


def backend_input(out) -> str:
    return open_artifact("litert", out / "model.tflite").input_name


@needs_litert
def test_the_forms_table_shows_it_and_the_core_serves_it_when_asked_for(export):
    report = next(iter(json.loads((export["out"] / "report.json").read_text()).values()))  # keyed by the model
    rows = {row["form"]: row for row in report["forms"]["rows"]}
    assert rows["litert"]["status"] == "made" and rows["litert"]["parity_passed"]
    from handlers.core import ImageCore
    core = ImageCore.from_folder(export["out"], threads=1)
    answer = core.answer((ROOT / "examples" / "cat.jpg").read_bytes())
    assert answer["artifact"] == "litert" and len(answer["predictions"]) == 3


class TinyDetector(torch.nn.Module):
    """A head's boxes and scores, kept by torchvision's nms: how many boxes come back depends on the image."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Conv2d(3, 5, 3, padding=1)

    def forward(self, x):
        rows = self.head(x).flatten(2)[0].T
        boxes = torch.cat([rows[:, :2], rows[:, :2] + rows[:, 2:4].abs() + 1], 1)
        scores = rows[:, 4].sigmoid()
        keep = torchvision.ops.nms(boxes, scores, 0.5)
        return boxes[keep], scores[keep]


@needs_litert
def test_a_model_the_converter_cannot_lower_is_refused_with_its_reason(tmp_path):
    module = TinyDetector().eval()
    context = BuildContext(module, module, torch.rand(1, 3, 16, 16), tmp_path, 18, resizes_in_graph=False,
                           io=GraphIO(outputs=("boxes", "scores"), dynamic_batch=False, any_size=True))
    with pytest.raises(litert.ConversionError, match="litert-torch could not convert it: .*torchvision.nms"):
        kinds.get("litert").build(context, kinds.get("litert"))
    assert not (tmp_path / "model.tflite").exists()


def test_without_litert_torch_the_export_refuses_it_saying_how_to_install_it(tmp_path, monkeypatch):
    # The main environment has no litert-torch; in .venv-litert, block it the way a missing package fails.
    monkeypatch.setitem(sys.modules, "litert_torch", None)
    done, manifest = export_plain(tmp_path / "plain")
    assert done.returncode == 0, done.stdout + done.stderr  # the other forms go on
    refusal = manifest.refused["litert"]
    assert (refusal.step, refusal.error) == ("build", "ConversionError")
    assert "litert-torch package" in refusal.message and "make litert-env" in refusal.message
    assert "Traceback" not in done.stdout + done.stderr and "traced" in manifest.artifacts
