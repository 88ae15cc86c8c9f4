"""Accuracy-aware int8 (export/precision/int8_fallback.py): the graph edit that puts nodes back in fp32 survives ONNX
Runtime's own session optimisations, the ranking finds the node that does the damage, and EfficientNet-Lite0
exported with --precision fp32,int8 passes the gate with its fp32 nodes recorded and is served as onnx-int8.
Real ONNX Runtime quantization throughout."""

from __future__ import annotations

import zipfile
from types import SimpleNamespace

import onnx
import pytest
import torch
from torch import nn

from export.precision import int8_fallback
from export.precision.calibration import TensorReader
from export.precision.gate import INT8_TOLERANCE


class TwoConvs(nn.Module):
    """A depthwise convolution whose channels differ 1000x in scale, then a pointwise one: per-tensor int8
    weights ruin the small channels, fp32 keeps them."""

    def __init__(self):
        super().__init__()
        self.depthwise = nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.pointwise = nn.Conv2d(4, 8, 1)
        self.act = nn.ReLU6()
        with torch.no_grad():
            self.depthwise.weight.mul_(torch.tensor([1000.0, 1.0, 1.0, 0.001]).view(4, 1, 1, 1))

    def forward(self, x):
        return self.pointwise(self.act(self.depthwise(x))).mean(dim=(2, 3))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process
    base = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    module, images = TwoConvs().eval(), torch.rand(16, 4, 8, 8)
    torch.onnx.export(module, images[:1], str(base / "fp32.onnx"), input_names=["input"], dynamo=False,
                      dynamic_axes={"input": {0: "n"}})
    quant_pre_process(str(base / "fp32.onnx"), str(base / "prepared.onnx"))
    quantize_static(str(base / "prepared.onnx"), str(base / "int8.onnx"), TensorReader(images, "input"),
                    quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, extra_options=int8_fallback.QUANTIZE_OPTIONS)
    with torch.no_grad():
        reference = module(images)
    return {"qdq": onnx.load(str(base / "int8.onnx")), "prepared": onnx.load(str(base / "prepared.onnx")),
            "images": images, "reference": reference}


def test_nodes_are_named_by_kind_and_depthwise_is_told_apart(tiny):
    kinds = int8_fallback.ranked_nodes(tiny["prepared"])
    assert sorted(kinds.values()) == ["conv", "depthwise conv"]


def test_reverted_nodes_stay_fp32_in_the_serving_session(tiny):
    """ORT's WeightBiasQuantization re-quantizes a float Conv between Q/DQ pairs at load; the edit must not be
    undone: the serving session (ORT_ENABLE_ALL) computes what the graph says (no optimisation)."""
    import onnxruntime as ort
    everything = set(int8_fallback.ranked_nodes(tiny["prepared"]))
    reverted = int8_fallback.revert_to_fp32(tiny["qdq"], tiny["prepared"], everything)
    onnx.checker.check_model(reverted)
    served = int8_fallback.session_run(reverted, tiny["images"])
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    literal = ort.InferenceSession(reverted.SerializeToString(), options, providers=["CPUExecutionProvider"])
    as_written = torch.from_numpy(literal.run(None, {"input": tiny["images"].numpy()})[0])
    assert (served - as_written).abs().max().item() < 1e-5
    error = lambda out: (out - tiny["reference"]).abs().max().item()  # noqa: E731
    assert error(served) < error(int8_fallback.session_run(tiny["qdq"], tiny["images"])) / 5
    assert not any(n.op_type == "DequantizeLinear" and n.input[0].endswith("_quantized")
                   for n in reverted.graph.node), "a reverted node still reads quantized weights"


def test_the_ranking_puts_the_damaging_depthwise_first(tiny):
    ranking = int8_fallback.rank_by_damage(tiny["qdq"], tiny["prepared"], tiny["images"], tiny["reference"])
    assert [r["kind"] for r in ranking][0] == "depthwise conv"
    assert ranking[0]["damage"] >= ranking[1]["damage"]


def test_the_selection_target_allows_half_of_each_shortfall_the_gate_allows():
    target = int8_fallback.selection_tolerance(INT8_TOLERANCE)
    assert target.min_top1_agreement == pytest.approx(0.99) and target.min_top5_agreement == pytest.approx(0.995)
    assert target.max_relative_logit_error == pytest.approx(0.15)
    assert target.max_accuracy_drop_points == pytest.approx(0.5)


def steps(*within: bool, met_at: int | None = None) -> list:
    return [int8_fallback.FallbackStep(count, {}, None, ok, count == met_at)
            for count, ok in enumerate(within, start=1)]


def test_the_fallback_keeps_the_step_that_met_the_target_else_the_fewest_nodes_within_the_gate():
    assert int8_fallback.chosen_count(steps(False, True, True, met_at=3), 12) == (
        3, "the calibration images met the selection target")
    count, why = int8_fallback.chosen_count(steps(False, True, False, True), 4)
    assert count == 2 and "fewest nodes within the gate's own tolerance (2)" in why
    count, why = int8_fallback.chosen_count(steps(False, False), 2)
    assert count == 2 and "no count met" in why


@pytest.mark.slow
def test_lite0_int8_passes_with_fp32_nodes_recorded_and_is_served(lite0_int8_export):
    manifest, store = lite0_int8_export["manifest"], lite0_int8_export["store"]
    record = manifest.artifacts["onnx-int8"]
    fallback = record.details["made_by"]["fp32_fallback"]
    nodes = fallback["fp32_nodes"]
    assert 1 <= len(nodes) <= int8_fallback.MAX_FP32_NODES and fallback["passed_on_calibration"]
    assert any(n["kind"] == "depthwise conv" for n in nodes)
    assert [s["fp32_nodes"] for s in fallback["steps"]] == list(range(1, len(nodes) + 1))
    assert fallback["steps"][-1]["within_gate_tolerance"] and fallback["selection_target"]["share_of_tolerance"] == 0.5
    assert record.details["accuracy"]["passed"]
    assert manifest.precision["int8_choice"]["fp32_fallback"]["gate"] == "passed"
    assert manifest.decision().served == "onnx-int8"
    with zipfile.ZipFile(store / "efficientnet-lite0.mar") as archive:
        assert record.path in archive.namelist()


def test_a_graph_without_ranked_nodes_keeps_its_plain_int8_and_says_why(tiny, monkeypatch):
    """Nothing to put back in fp32 (here RANKED_OPS is emptied): the QDQ model is returned as it is, with the
    reason, and no step is tried."""
    monkeypatch.setattr(int8_fallback, "RANKED_OPS", ())
    inputs = int8_fallback.FallbackInputs(tiny["qdq"], tiny["prepared"], tiny["images"], tiny["reference"])
    progress = SimpleNamespace(step=lambda line: None)
    model, fallback = int8_fallback.fall_back(inputs, SimpleNamespace(name="onnx-int8", precision="int8"),
                                              lambda model: 1.0, progress)
    assert model is tiny["qdq"] and fallback.steps == [] and fallback.fp32_nodes == []
    assert fallback.stopped_because.endswith("node to put back in fp32")
