"""The int8 divergence report (export/divergence/int8.py): ONNX Runtime's qdq_loss_debug SQNR of every quantized
tensor, each named by its module and source line. The held-out fault: plain int8 of EfficientNet-Lite0 (trained
weights, the pipeline's quantize_static options) must be named at its first depthwise convolution, at the line of
models/efficientnet.py that calls it; a tiny model with one layer damaged on purpose must be named at that layer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from export.divergence import int8 as divergence
from export.precision.calibration import ImageSet
from export.precision.onnx_int8 import Int8Work

CALIBRATION_IMAGES = 32  # lite0's ranges from a third of the export's 100: the fault shows all the same
# 7-bit weights, as the pipeline quantizes on every x86 CPU without VNNI (onnx_int8.weight_bits), pinned so the held-out
# fault is the same on every CI machine: with 8-bit weights (a VNNI CPU) lite0's first depthwise convolution stays
# above the floor (measured on a Zen 5: the first below is blocks.0.project.0 at 21.6 dB; docs/results/2026-11-25-divergence-report/)
SEVEN_BIT_WEIGHTS = (True, "7-bit weights, pinned by the test (every CPU without VNNI quantizes so)")


class Damaged(nn.Module):
    """A convolution, then one whose every output channel has one outlier weight (1000x) on an input channel that
    is always 0: per-channel int8 takes its scale from the outlier and rounds every weight that matters to 0."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.act = nn.ReLU6()
        self.damaged = nn.Conv2d(8, 8, 1)
        self.pointwise = nn.Conv2d(8, 4, 1)
        with torch.no_grad():
            self.stem.weight[0].zero_()
            self.stem.bias[0] = -1.0  # channel 0 is always 0 after the ReLU6
            self.damaged.weight[:, 0] = 1000.0

    def forward(self, x):
        x = self.act(self.stem(x))
        return self.pointwise(self.damaged(x))


def quantize(module: nn.Module, images: torch.Tensor, folder, dynamo: bool = False):
    """fp32 ONNX of `module` as the pipeline exports it, then plain int8 with the pipeline's own options."""
    from onnxruntime.quantization.shape_inference import quant_pre_process
    fp32, prepared, int8 = folder / "fp32.onnx", folder / "prepared.onnx", folder / "int8.onnx"
    with torch.no_grad():
        if dynamo:
            torch.onnx.export(module, (images[:2],), str(fp32), dynamo=True, input_names=["input"],
                              dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},)).save(str(fp32))
        else:
            torch.onnx.export(torch.jit.trace(module, images[:1]), (images[:1],), str(fp32), dynamo=False,
                              input_names=["input"], dynamic_axes={"input": {0: "batch"}})
    quant_pre_process(str(fp32), str(prepared))
    calibration = ImageSet(images, [f"#{i}" for i in range(len(images))], "test images")
    Int8Work(folder, prepared, folder / "ranges.json", calibration, SEVEN_BIT_WEIGHTS).quantize(int8, "QUInt8")
    return fp32, int8


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    torch.manual_seed(0)
    module, images = Damaged().eval(), torch.rand(16, 3, 16, 16)
    return module, images, quantize(module, images, tmp_path_factory.mktemp("damaged"))


def test_the_damaged_layer_is_named_first_below_the_floor(damaged):
    module, images, (fp32, int8) = damaged
    report = divergence.explain_int8(fp32, int8, images, module=module)
    assert report.first is not None and report.first.key == "damaged", report.markdown()
    assert report.first.kind == "conv" and report.first.source.endswith(f"{__file__}:{forward_line()}")
    assert all(r.sqnr_db >= divergence.SQNR_FLOOR_DB for r in report.rows[:report.rows.index(report.first)])
    assert report.line().startswith("onnx-int8: SQNR first below") and "damaged" in report.line()
    json.dumps(report.as_dict())


def forward_line() -> int:
    import inspect
    lines, start = inspect.getsourcelines(Damaged.forward)
    return start + next(i for i, line in enumerate(lines) if "self.damaged(" in line)


def test_torch_export_onnx_names_the_layer_and_its_line_without_the_module(tmp_path):
    torch.manual_seed(0)
    module, images = Damaged().eval(), torch.rand(16, 3, 16, 16)
    fp32, int8 = quantize(module, images, tmp_path, dynamo=True)
    report = divergence.explain_int8(fp32, int8, images)
    assert report.first is not None and report.first.key == "damaged", report.markdown()
    assert report.first.source.endswith(f":{forward_line()}")


def test_module_paths_in_the_torchscript_based_exporter_spelling():
    assert divergence.legacy_key("/network/blocks/0/depthwise/0/Conv") == "network.blocks.0.depthwise.0"
    assert divergence.legacy_key("/blocks/blocks.0/conv/conv.0/Conv") == "blocks.0.conv.0"
    assert divergence.legacy_key("/layer1/0/relu_1/Relu") == "layer1.0.relu@1"
    assert divergence.legacy_key("/Div") == ""


def test_rankings_are_compared_by_first_node_overlap_and_spearman():
    rows = [divergence.SqnrRow(f"t{i}", f"n{i}", "Conv", "conv", f"m{i}", "", 20.0, drop)
            for i, drop in enumerate([9.0, 1.0, 5.0, 3.0])]
    ranking = divergence.compare_rankings(rows, [{"node": n} for n in ("n0", "n2", "n1", "n3")], top=2)
    assert ranking["same_first"] and ranking["overlap"] == 2 and ranking["sqnr_top"] == ["n0", "n2"]
    assert ranking["spearman"] == pytest.approx(0.8)


def test_images_that_are_not_a_batch_are_refused_with_what_to_pass(damaged):
    _, _, (fp32, int8) = damaged
    with pytest.raises(divergence.Int8DivergenceError, match="N x C x H x W"):
        divergence.explain_int8(fp32, int8, torch.rand(3, 16, 16))


@pytest.fixture(scope="module")
def lite0(tmp_path_factory):
    """lite0 (trained weights) exported and quantized once, plain (build_int8's options); `explicit` quantizes
    the same prepared graph with the fallback's options from the cached ranges, as variants._fall_back does."""
    import models
    from export.precision.calibration import default_images
    from models.efficientnet import weights_preprocessing
    folder = tmp_path_factory.mktemp("lite0")
    module = models.entry_of("efficientnet", "lite0").build("imagenet").module.eval()
    contract = weights_preprocessing("lite0")
    calibration = default_images(contract, "calibration", CALIBRATION_IMAGES).images
    fp32, int8 = quantize(module, calibration, folder)
    work = Int8Work(folder, folder / "prepared.onnx", folder / "ranges.json",
                     ImageSet(calibration, [f"#{i}" for i in range(len(calibration))], "test images"),
                     SEVEN_BIT_WEIGHTS)
    return module, default_images(contract, "holdout", 8).images, fp32, int8, work


def depthwise_call_line() -> int:
    import models
    lines = Path(models.efficientnet.__file__).read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if "self.depthwise(" in line)


def test_lite0_plain_int8_is_named_at_its_first_depthwise_convolution(lite0):
    """The held-out fault (docs/results/2026-11-24-int8-efficientnet-lite0/): the pipeline's source kind for lite0 (onnx-traced, first of
    ONNX_SOURCES), quantize_static as build_int8 calls it, no fallback."""
    module, holdout, fp32, int8, _ = lite0
    report = divergence.explain_int8(fp32, int8, holdout, module=module)
    named = report.first
    assert named is not None and named.key.startswith("network.blocks.0.depthwise."), report.markdown()
    assert named.kind == "depthwise conv"
    assert named.source.endswith(f"models/efficientnet.py:{depthwise_call_line()}")
    assert all(r.sqnr_db >= divergence.SQNR_FLOOR_DB for r in report.rows[:report.rows.index(named)])


def test_lite0_with_explicit_activations_compares_each_conv_after_its_relu6(lite0):
    """The fallback's graph (int8_fallback.QUANTIZE_OPTIONS): the Q/DQ after a Conv takes its ReLU6's range, so
    the Conv's own tensor would read ~0 dB; the ReLU6's output is compared under the conv's name instead."""
    from export.precision.int8_fallback import QUANTIZE_OPTIONS
    module, holdout, fp32, _, work = lite0
    explicit = work.folder / "explicit.onnx"
    work.quantize(explicit, "QUInt8", QUANTIZE_OPTIONS)
    import onnx
    convs = [n.name for n in onnx.load(str(fp32)).graph.node if n.op_type == "Conv"][:4]
    record = fallback_record(convs)
    report = divergence.explain_int8(fp32, explicit, holdout, fallback_record=record, module=module)
    assert report.ranking is not None and report.ranking["damage_first"] == convs[0], report.ranking
    assert report.ranking["spearman"] is not None and "damage ranking" in report.markdown()
    named = report.first
    assert named is not None and named.key.startswith("network.blocks.0.depthwise."), report.markdown()
    assert named.kind == "depthwise conv" and named.op == "Conv"
    assert named.source.endswith(f"models/efficientnet.py:{depthwise_call_line()}")
    assert all(r.sqnr_db >= divergence.SQNR_FLOOR_DB for r in report.rows[:report.rows.index(named)])
    assert not any(r.op in ("Relu", "Clip") for r in report.rows)  # each activation reads as its conv


def fallback_record(nodes: list[str]) -> dict:
    """made_by.fp32_fallback as the manifest stores it: int8_fallback.Fallback.record(), through JSON."""
    from export.precision.int8_fallback import Fallback
    ranking = [{"node": n, "kind": "conv", "damage": round(0.1 / (i + 1), 5)} for i, n in enumerate(nodes)]
    return json.loads(json.dumps(Fallback(ranking, fp32_nodes=ranking[:1], limit=1).record()))


def test_the_fallback_record_is_read_in_each_shape_the_manifest_keeps():
    """Fallback.record() itself, the artifact record holding it at details.made_by.fp32_fallback, and
    int8_choice's summary ("name (kind)" strings)."""
    nodes = ["/network/stem/stem.0/Conv", "/network/blocks/blocks.0/depthwise/depthwise.0/Conv"]
    record = fallback_record(nodes)
    summary = {"nodes": [f"{n} (conv)" for n in nodes], "images_per_s_batch1": 1.0, "gate": "passed"}
    for given in (record, {"details": {"made_by": {"tool": "quantize_static", "fp32_fallback": record}}}, summary):
        assert [r["node"] for r in divergence.damage_ranking(given)] == nodes
    assert divergence.damage_ranking({"made_by": {"fp32_fallback": None}}) == []
