"""The ExecuTorch kinds through the real export command: `executorch` (the model's torch.export form lowered to
XNNPACK, a `.pte` held to eager by parity through ExecuTorch's own runtime) and `executorch-int8` (PT2E int8 from the
calibration images, held to fp32 by the accuracy gate), each with its input contract beside it; one export of the
tests' small user model is shared. A detector whose box count comes from the data (torchvision's nms) is refused
naming the operator."""

from __future__ import annotations

import json

import pytest
import torch
import torchvision

from export.forms import executorch, kinds
from export.forms.exporters import BuildContext, GraphIO
from export.precision.request import PrecisionRequest, sources_to_build
from runtime import RunOptions, open_artifact
from runtime.integrity import file_sha256
from tests.conftest import ROOT
from tests.export.user_models import plain_export_with_int8

pytest.importorskip("executorch")

PROGRAMS = {"executorch": ("model.pte", "model.executorch.json"),
            "executorch-int8": ("model.int8.pte", "model.int8.executorch.json")}


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> dict:
    return plain_export_with_int8(tmp_path_factory.mktemp("executorch") / "plain", "executorch")


def test_the_device_programs_are_built_when_named_never_for_a_server_by_default():
    assert "executorch" not in kinds.default_formats() and kinds.get("executorch").off_by_default
    assert kinds.get("executorch-int8").sources == ("executorch",)
    automatic = PrecisionRequest(("fp32", "int8"), automatic=True)
    assert "executorch" not in sources_to_build(automatic, formats_given=False, skipped=None)


def test_the_fp32_program_passes_parity_through_executorchs_runtime(export):
    manifest, out = export["manifest"], export["out"]
    record = manifest.artifacts["executorch"]
    assert (record.path, record.format, record.precision) == ("model.pte", "executorch", "fp32")
    assert manifest.parity["summary"]["executorch"]["passed"] and "executorch ok" in export["stdout"]
    backend = open_artifact("executorch", out / record.path)
    assert type(backend).__name__ == "ExecuTorchBackend" and backend.describe()["max_batch"] == executorch.MAX_BATCH


def test_the_int8_program_is_gated_on_the_held_out_images(export):
    manifest = export["manifest"]
    record = manifest.artifacts["executorch-int8"]
    assert (record.path, record.precision, record.source) == ("model.int8.pte", "int8", "executorch")
    accuracy, made = record.details["accuracy"], record.details["made_by"]
    assert accuracy["images"] >= 100 and accuracy["ran_in"] == "int8" and "executorch-int8" in manifest.precision["gate"]
    assert made["calibration_images"] == manifest.precision["calibration"]["count"]
    assert made["delegate"]["subgraphs"] >= 1 and made["quantizer"] == "XNNPACKQuantizer"


@pytest.mark.parametrize("kind", PROGRAMS)
def test_each_program_has_its_input_contract_beside_it_hashed_with_it(export, kind):
    program, contract_file = PROGRAMS[kind]
    out, record = export["out"], export["manifest"].artifacts[kind]
    assert record.companions == {contract_file: file_sha256(out / contract_file)}
    contract = json.loads((out / contract_file).read_text())
    assert (contract["program"], contract["method"]) == (program, "forward")
    assert contract["input"]["shape"] == [f"1..{executorch.MAX_BATCH}", 3, 32, 32]
    assert (contract["input"]["layout"], contract["input"]["dtype"]) == ("NCHW", "float32")
    assert contract["input"]["normalisation"].startswith("in the graph")
    assert contract["preprocessing"]["centre_crop"] == [32, 32] and contract["bytes"] == (out / program).stat().st_size
    assert set(contract["latency_ms_batch1"]) >= {"threads_1"} and all(
        ms > 0 for ms in contract["latency_ms_batch1"].values())


def test_the_forms_table_shows_both_and_the_core_serves_a_program(export):
    report = next(iter(json.loads((export["out"] / "report.json").read_text()).values()))  # keyed by the model
    rows = {row["form"]: row for row in report["forms"]["rows"]}
    for kind in PROGRAMS:
        assert rows[kind]["status"] == "made" and rows[kind]["size_mb"] is not None
    assert rows["executorch"]["parity_passed"] and rows["executorch-int8"]["gate"] == "passed"
    from handlers.core import ImageCore
    core = ImageCore.from_folder(export["out"], threads=1)
    answer = core.answer((ROOT / "examples" / "cat.jpg").read_bytes())
    assert answer["artifact"] in PROGRAMS and len(answer["predictions"]) == 3


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


def test_a_detector_whose_box_count_comes_from_nms_is_refused_naming_the_operator(tmp_path):
    module = TinyDetector().eval()
    context = BuildContext(module, module, torch.rand(1, 3, 16, 16), tmp_path, 18, resizes_in_graph=False,
                           io=GraphIO(outputs=("boxes", "scores"), dynamic_batch=False, any_size=True))
    with pytest.raises(executorch.LoweringError, match="torchvision::nms return"):
        kinds.get("executorch").build(context, kinds.get("executorch"))
    assert not (tmp_path / "model.pte").exists()


def test_the_threads_option_sizes_xnnpacks_pool(export):
    backend = open_artifact("executorch", export["out"] / "model.pte", RunOptions(threads=1))
    assert backend.describe()["xnnpack_threads"] == 1
