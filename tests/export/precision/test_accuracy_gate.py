"""The accuracy gate's metrics, verdicts, label matching, int8 type choice and the serving rule (pure)."""

import math

import pytest
import torch

from export.package.selection import Candidate, decide
from export.precision.gate import (
    EXIT_ACCURACY_GATE,
    GATE_PASSED,
    INT8_TOLERANCE,
    TOLERANCE_BY_PRECISION,
    AccuracyGateError,
    accuracy,
    judge,
    label_targets,
    render_table,
)
from export.precision.onnx_int8 import choose_activation_type
from export.precision.request import PrecisionError, parse_precisions
from gates.topk import agreement_metrics

SIZE = (3, 224, 224)


def logits(rows=200, classes=10, seed=0):
    return torch.randn(rows, classes, generator=torch.Generator().manual_seed(seed)) * 4


def test_identical_logits_agree_fully_and_pass():
    reference = logits()
    result = judge("onnx-int8", "int8", reference, reference.clone())
    assert result.passed and result.verdict == GATE_PASSED
    assert result.metrics["top1_agreement"] == result.metrics["top5_agreement"] == 1.0
    assert result.metrics["mean_logit_error"] == result.metrics["max_logit_error"] == 0.0


def test_flipped_top1_on_a_few_rows_counts_exactly():
    reference = logits()
    candidate = reference.clone()
    for row in range(6):  # swap the best and second-best class on 6 of 200 rows: 97 % agreement
        top2 = reference[row].topk(2).indices
        candidate[row, top2[0]], candidate[row, top2[1]] = reference[row, top2[1]], reference[row, top2[0]]
    metrics = agreement_metrics(reference, candidate)
    assert metrics["top1_agreement"] == pytest.approx(194 / 200)
    assert metrics["top5_agreement"] == 1.0  # fp32's answer is still second
    result = judge("onnx-int8", "int8", reference, candidate)
    confident = metrics["confident_images"]  # the gate counts top-1 where fp32 is confident
    assert not result.passed and f"on the {confident} confident images < 98.0%" in result.failures[0]


def test_small_noise_passes_and_noise_of_the_logit_spread_fails():
    reference = logits()
    noise = torch.randn(reference.shape, generator=torch.Generator().manual_seed(1))
    quiet = judge("onnx-int8", "int8", reference, reference + 0.01 * noise)
    loud = judge("onnx-int8", "int8", reference, reference + 4 * noise)
    assert quiet.passed, quiet.failures
    assert quiet.metrics["relative_logit_error"] < 0.01
    assert not loud.passed and any("mean logit error" in f for f in loud.failures)


def test_non_finite_outputs_fail():
    reference = logits()
    candidate = reference.clone()
    candidate[0, 0] = math.nan
    result = judge("onnx-fp16", "fp16", reference, candidate)
    assert not result.passed and result.metrics["relative_logit_error"] == math.inf


def test_accuracy_and_its_drop_are_in_points_and_gate_the_variant():
    targets = torch.arange(200) % 10
    reference = torch.nn.functional.one_hot(targets, 10).float() * 5  # fp32: 100 % correct
    candidate = reference.clone()
    candidate[:3] = torch.nn.functional.one_hot((targets[:3] + 1) % 10, 10).float() * 5  # 3 wrong: 98.5 %
    assert accuracy(reference, targets)["top1"] == 100.0
    result = judge("onnx-int8", "int8", reference, candidate, targets)
    assert result.metrics["accuracy"]["top1"] == pytest.approx(98.5)
    assert result.metrics["accuracy_drop_points"]["top1"] == pytest.approx(1.5)
    assert any("drop 1.50 points > 1" in f for f in result.failures)
    assert "| 98.50% (100.00%) | 98.50% (100.00%) | 1.50 / 1.50 | FAIL" in render_table([result])


def test_every_precision_has_named_tolerances_and_fp16_is_stricter_than_int8():
    assert set(TOLERANCE_BY_PRECISION) == {"int8", "bf16", "fp16"}
    fp16 = TOLERANCE_BY_PRECISION["fp16"]
    assert fp16.min_top1_agreement > INT8_TOLERANCE.min_top1_agreement
    assert fp16.max_accuracy_drop_points < INT8_TOLERANCE.max_accuracy_drop_points


def test_the_gate_error_carries_the_numbers_and_its_own_exit_code():
    reference = logits()
    failed = judge("onnx-int8", "int8", reference, -reference)
    error = AccuracyGateError([failed], render_table([failed]))
    assert error.exit_code == EXIT_ACCURACY_GATE != 1
    assert "onnx-int8" in str(error) and "top-1 agreement" in str(error) and "not servable" in str(error)
    assert "| onnx-int8 | int8 | 200 |" in error.table


def test_near_tie_logits_are_judged_on_every_image_and_the_error_says_how_to_judge_them_where_fp32_is_sure():
    near_ties = logits(rows=200, classes=1000) * 0.005  # random weights: no image clears the confident margin
    noisy = near_ties + torch.randn(near_ties.shape, generator=torch.Generator().manual_seed(1)) * 0.005
    failed = judge("openvino-int8", "int8", near_ties, noisy)
    assert failed.metrics["confident_images"] == 0
    assert any("on every image (too few confident ones: 0 < 32)" in f for f in failed.failures), failed.failures
    assert "a larger --validation DIR" in str(AccuracyGateError([failed], render_table([failed])))
    reference = logits()  # confident rows: flips there are the quantization's, and no hint
    confident = judge("onnx-int8", "int8", reference, -reference)
    assert confident.metrics["confident_images"] >= 32 and not confident.passed
    assert "--validation" not in str(AccuracyGateError([confident], render_table([confident])))


def test_folder_classes_match_labels_by_name_or_by_output_index():
    labels = ["tench", "goldfish", "great white shark"]
    targets, how = label_targets(["Great_White_Shark", "tench"], [0, 1, 1], labels, 3)
    assert targets.tolist() == [2, 0, 0] and "labels" in how
    targets, how = label_targets(["0", "2"], [0, 1], None, 3)
    assert targets.tolist() == [0, 2] and "output index" in how
    targets, how = label_targets(["cat", "dog"], [0, 1], labels, 3)
    assert targets is None and "cat" in how
    assert label_targets(None, None, labels, 3)[0] is None


def test_int8_activation_type_is_the_fastest_that_passed():
    assert choose_activation_type({"QUInt8": (130.0, True), "QInt8": (57.0, True)})[0] == "QUInt8"
    chosen, why = choose_activation_type({"QUInt8": (130.0, False), "QInt8": (57.0, True)})
    assert chosen == "QInt8" and "passed" in why
    chosen, why = choose_activation_type({"QUInt8": (130.0, False), "QInt8": (57.0, False)})
    assert chosen == "QUInt8" and why.startswith("none passed")


def test_precision_lists_need_fp32_and_known_names():
    assert parse_precisions("fp32, int8,INT8") == ("fp32", "int8")
    for bad in ("int8", "fp32,int4", ""):
        with pytest.raises(PrecisionError):
            parse_precisions(bad)


def test_a_gated_int8_is_served_first_and_a_failed_one_never():
    fp32 = [Candidate(k, True, (), True, SIZE) for k in ("onnx-dynamo", "onnx-traced", "scripted")]
    passed = decide(fp32 + [Candidate("onnx-int8", True, (), False, SIZE, gate=GATE_PASSED)], SIZE)
    assert passed.served == "onnx-int8"
    failed = decide(fp32 + [Candidate("onnx-int8", True, (), False, SIZE, gate="failed: top-1 agreement 50%")], SIZE)
    assert failed.served == "onnx-dynamo"
    assert "onnx-int8" not in failed.servable
    assert failed.candidates["onnx-int8"] == "accuracy gate failed: top-1 agreement 50%"


def test_variants_outside_the_preference_order_are_servable_only_on_request():
    candidates = [Candidate("onnx-dynamo", True, (), True, SIZE),
                  Candidate("scripted-bf16", True, (), True, SIZE, gate=GATE_PASSED)]
    decision = decide(candidates, SIZE)
    assert decision.served == "onnx-dynamo" and "scripted-bf16" in decision.servable
    assert decision.candidates["scripted-bf16"].startswith("servable when asked for (--serve)")
    assert decide(candidates, SIZE, requested="scripted-bf16").served == "scripted-bf16"


def test_top1_flips_where_fp32_nearly_ties_are_not_counted_but_top5_and_logit_error_still_are():
    reference = torch.zeros(64, 10)
    reference[:, 0] = 5.0  # confident: class 0 far ahead
    reference[:8, 1] = 4.999  # 8 near-ties between classes 0 and 1
    candidate = reference.clone()
    candidate[:8, 1] = 5.001  # int8 flips exactly the near-ties
    result = judge("onnx-int8", "int8", reference, candidate)
    assert result.metrics["confident_images"] == 56 and result.metrics["top1_agreement"] == pytest.approx(56 / 64)
    assert result.passed, result.failures
    candidate[8:16, 0] = -5.0  # a confident answer lost from the top 5 still fails
    assert not judge("onnx-int8", "int8", reference, candidate).passed


def test_too_few_confident_images_count_top1_on_every_image():
    reference = torch.zeros(64, 10)
    reference[:, 0], reference[:, 1] = 1.0, 0.999  # nothing confident
    candidate = reference.clone()
    candidate[:8, 1] = 1.001
    result = judge("onnx-int8", "int8", reference, candidate)
    assert result.metrics["confident_images"] == 0
    assert not result.passed and "on every image" in result.failures[0]


def test_held_out_images_that_cannot_judge_say_so_before_any_search():
    from export.precision.calibration import ImageSet
    from export.precision.held_out import HeldOut
    near_ties = torch.zeros(40, 10)
    near_ties[:, 0] = 0.01  # fp32 barely prefers a class: its top-1 is a near tie on every image
    images = ImageSet(torch.zeros(40, 3, 8, 8), ["generated"] * 40, "test images")
    undecided = HeldOut(images, near_ties, None, "no labels")
    assert not undecided.can_judge
    note = undecided.cannot_judge_note()
    assert "confident on only 0 of the 40" in note and "--validation" in note and "accuracy control" in note
    confident = near_ties.clone()
    confident[:, 0] = 10.0
    assert HeldOut(images, confident, None, "no labels").can_judge
