"""A new artifact kind is one row, one backend and one exporter function: no other edit.

This test adds `onnx-ort-optimized` (ONNX Runtime's offline graph optimisation of the traced ONNX, saved and
opened by its own small backend under a new format) from the outside, and shows it exported, parity-checked,
chosen by the serving rule, packaged and served by the engine-independent request core, without touching the
pipeline, parity, selection, the archive or the handler. The model is the tests' small user model: what is
shown is the table's reach, which does not depend on the model's size. Counted in files: a real addition puts the row in
export/forms/kinds.py, the exporter in export/forms/exporters.py, the backend in runtime/ and one line in runtime/base.py's
BACKENDS; before the table it was about seven places in six files.
"""

from __future__ import annotations

import zipfile

import onnxruntime as ort
import pytest
import torch

from contract.records import INPUT_NAME, Manifest
from export.forms import kinds
from export.forms.exporters import BuildContext
from export.forms.tolerances import ONNX_TOLERANCE
from export.package.archive import ArchiveRequest
from export.pipeline import ExportOptions, Progress, export_model
from models.user_module import user_entry
from runtime import base
from runtime.base import Backend, RunOptions
from tests.conftest import ROOT
from tests.export.user_models import USER_FILE

pytestmark = pytest.mark.slow

KIND = "onnx-ort-optimized"
FORMAT = "onnx-ort"
CAT = ROOT / "examples" / "cat.jpg"


class PreOptimizedOnnxBackend(Backend):
    """Opens a graph ONNX Runtime already optimised offline, so it skips its own optimisation passes."""

    format = FORMAT

    def __init__(self, path, options: RunOptions, name=None):
        super().__init__(path, options, name)
        settings = ort.SessionOptions()
        settings.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        settings.intra_op_num_threads = options.threads
        self.session = ort.InferenceSession(str(path), settings, providers=["CPUExecutionProvider"])

    def predict(self, batch: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.session.run(None, {INPUT_NAME: batch.contiguous().numpy()})[0])


def optimize_offline(context: BuildContext, kind) -> object:
    """The exporter: ONNX Runtime's extended graph optimisations, written to the kind's file."""
    source = context.built[kind.needs[0]]
    artifact = context.artifact(kind, source_dynamic=source.spatial_dynamic)
    settings = ort.SessionOptions()
    settings.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    settings.optimized_model_filepath = str(artifact.path)
    ort.InferenceSession(str(source.path), settings, providers=["CPUExecutionProvider"])
    return artifact


@pytest.fixture
def new_kind():
    base.BACKENDS[FORMAT] = f"{__name__}:PreOptimizedOnnxBackend"
    kinds.register(kinds.ArtifactKind(
        KIND, "model.ort-optimized.onnx", FORMAT, "onnxruntime offline graph optimisation of onnx-traced",
        "source", serving_rank=5, rank_reason="ahead of the others in this test, to show the rule picks it up",
        tolerance=ONNX_TOLERANCE, build=optimize_offline, needs=("onnx-traced",)))
    yield
    kinds.unregister(KIND)
    del base.BACKENDS[FORMAT]


def test_a_kind_added_to_the_table_is_exported_proven_chosen_packaged_and_served(new_kind, tmp_path):
    out, store = tmp_path / "out", tmp_path / "store"
    result = export_model(user_entry(f"{USER_FILE}:plain", (1, 3, 16, 16)),
                          ExportOptions(out, archive=ArchiveRequest(store)), Progress(quiet=True))

    manifest = Manifest.read(out)
    record = manifest.artifacts[KIND]
    assert (out / record.path).is_file() and record.format == FORMAT and not record.spatial_dynamic
    assert result.parity.passed(KIND) and manifest.parity["summary"][KIND]["passed"]
    assert KIND in {row.artifact for row in result.trace_vs_script.rows}
    preference = manifest.serving.preference
    assert manifest.serving.served == KIND and preference.index(KIND) < preference.index("onnx-dynamo")

    with zipfile.ZipFile(result.archive) as archive:
        assert record.path in archive.namelist()
        archive.extractall(tmp_path / "unpacked")
    from handlers.core import ImageCore
    core = ImageCore.from_folder(tmp_path / "unpacked")
    answer = core.answer(CAT.read_bytes())
    assert answer["artifact"] == KIND and len(answer["predictions"]) == manifest.output.classes

    # the same image through the fp32 ONNX it was optimised from, run in-process: the same answer
    from runtime import open_artifact
    from runtime.images import decode_upright, draft_floor, preprocess
    source = manifest.artifacts["onnx-traced"]
    contract = manifest.input.image_contract()  # decoded as the handler decodes it (draft when the check passed)
    row = preprocess(decode_upright(CAT.read_bytes(), draft_floor(contract)), contract)[None]
    expected = torch.softmax(open_artifact(source.format, out / source.path)(row), dim=1)[0].sort(descending=True)
    assert [p["index"] for p in answer["predictions"]] == expected.indices.tolist()
    assert [p["probability"] for p in answer["predictions"]] == pytest.approx(expected.values.tolist(), abs=1e-4)


def test_without_the_row_the_kind_does_not_exist(tmp_path):
    with pytest.raises(Exception, match="unknown artifact kind 'onnx-ort-optimized'"):
        kinds.get(KIND)
