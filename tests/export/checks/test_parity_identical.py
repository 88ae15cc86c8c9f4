"""compare_outputs computes its figures in place, each step once; every figure and verdict must be the very one
the plain whole-tensor torch computation gives (`plain_compare` below, the straightforward spelling), bit for
bit, on the awkward cases too: NaN and inf on either side, zeros, ties, integers, other layouts, tolerances at
their edge."""

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from contract.records import DetectionLimits
from export.checks.detections import compare_sets
from export.checks.parity import TOPK, compare_outputs, topk_agreement
from export.forms.tolerances import (
    ONNX_TOLERANCE,
    SAME_KERNELS_SETS,
    TORCHSCRIPT_TOLERANCE,
    SetTolerance,
    Tolerance,
)


def plain_compare(reference, candidate, tolerance):
    """Each figure as its definition reads, over whole float64 tensors."""
    if isinstance(tolerance, SetTolerance):
        return compare_sets(reference, candidate, tolerance)
    reference = reference.detach().double().cpu()
    candidate = candidate.detach().double().cpu()
    if reference.shape != candidate.shape:
        return {"error": f"shape {tuple(candidate.shape)} != eager {tuple(reference.shape)}",
                "max_abs": math.inf, "max_rel": math.inf, "cosine": -1.0}, False
    diff = (candidate - reference).abs()
    magnitude = reference.abs()
    metrics = {
        "max_abs": diff.max().item(),
        "mean_abs": diff.mean().item(),
        "median_abs": diff.median().item(),
        "max_rel": (diff / magnitude.clamp_min(1e-12)).max().item(),
        "cosine": F.cosine_similarity(reference.flatten(), candidate.flatten(), dim=0, eps=1e-12).item(),
        "required_atol": (diff - tolerance.rtol * magnitude).clamp_min(0).max().item(),
        "required_rtol": ((diff - tolerance.atol).clamp_min(0) / magnitude.clamp_min(1e-12)).max().item(),
    }
    if not torch.isfinite(candidate).all():
        metrics["error"] = "non-finite values in the artifact's output"
    for k in TOPK:
        metrics[f"top{k}_agreement"] = topk_agreement(reference, candidate, k)
    if reference.dim() == 4:
        metrics["pixel_agreement"] = (reference.argmax(1) == candidate.argmax(1)).double().mean().item()
    passed = "error" not in metrics and bool((diff <= tolerance.atol + tolerance.rtol * magnitude).all())
    return metrics, passed


def same_value(a, b) -> bool:
    """Equal bit for bit as Python values: NaN equals NaN, and 0.0 is not -0.0."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return type(a) is type(b) and a == b


def assert_identical(reference, candidate, tolerance):
    kept = (reference.clone(), candidate.clone())
    expected, expected_passed = plain_compare(reference, candidate, tolerance)
    metrics, passed = compare_outputs(reference, candidate, tolerance)
    assert passed is expected_passed
    assert list(metrics) == list(expected)  # the same figures in the same order (parity.json keeps it)
    differing = {k: (expected[k], metrics[k]) for k in expected if not same_value(expected[k], metrics[k])}
    assert not differing, differing
    # the caller's tensors are untouched (the in-place steps work on copies, float64 inputs included)
    assert torch.equal(reference.nan_to_num(), kept[0].nan_to_num()) and torch.equal(
        candidate.nan_to_num(), kept[1].nan_to_num())
    return metrics, passed


def generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def near(reference: torch.Tensor, scale: float, seed: int = 1) -> torch.Tensor:
    """`reference` moved by relative and absolute noise of `scale` (another kernel's rounding, or worse)."""
    g = generator(seed)
    noise = torch.randn(reference.shape, generator=g, dtype=reference.dtype)
    return reference + reference * scale * noise + scale * 0.1 * torch.randn(reference.shape, generator=g,
                                                                                dtype=reference.dtype)


SEGMENTER = (2, 21, 130, 173)  # large enough that torch splits every reduction between threads


@pytest.mark.parametrize("scale", [0.0, 1e-7, 1e-5, 1e-3, 1.0])
@pytest.mark.parametrize("tolerance", [TORCHSCRIPT_TOLERANCE, ONNX_TOLERANCE, Tolerance(0.0, 0.0)])
def test_segmenter_scores_from_identical_to_far_off(scale, tolerance):
    reference = torch.randn(SEGMENTER, generator=generator()) * 4
    assert_identical(reference, near(reference, scale), tolerance)


@pytest.mark.parametrize("scale", [0.0, 1e-6, 1e-2])
def test_classifier_logits_and_their_top_k(scale):
    reference = torch.randn(8, 1000, generator=generator())
    metrics, _ = assert_identical(reference, near(reference, scale), ONNX_TOLERANCE)
    assert metrics["top5_agreement"] is not None


def test_ties_in_the_class_scores_keep_the_first_maximum():
    reference = torch.randint(0, 3, (2, 21, 40, 50), generator=generator()).float()
    candidate = torch.randint(0, 3, (2, 21, 40, 50), generator=generator(2)).float()
    metrics, _ = assert_identical(reference, candidate, ONNX_TOLERANCE)
    assert 0.0 < metrics["pixel_agreement"] < 1.0
    # float64 scores closer than float32 can tell apart: class 2 wins in float64, a float32 copy would tie them
    close = torch.ones(1, 3, 2, 2, dtype=torch.float64)
    close[0, 2] += 1e-12
    metrics, _ = assert_identical(close, torch.ones_like(close), ONNX_TOLERANCE)
    assert metrics["pixel_agreement"] == 0.0


@pytest.mark.parametrize("where", ["candidate", "reference", "both"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_values_on_either_side(where, value):
    reference = torch.randn(2, 21, 16, 24, generator=generator())
    candidate = near(reference, 1e-6)
    spots = torch.rand(reference.shape, generator=generator(3)) < 0.01
    if where in ("reference", "both"):
        reference[spots] = value
    if where in ("candidate", "both"):
        candidate[spots] = value
    metrics, passed = assert_identical(reference, candidate, ONNX_TOLERANCE)
    assert ("error" in metrics) == (where != "reference") and not (passed and "error" in metrics)


def test_a_single_nan_and_a_single_inf_among_many():
    reference = torch.randn(SEGMENTER, generator=generator())
    for value in (math.nan, math.inf):
        candidate = reference.clone()
        candidate[1, 7, 100, 3] = value
        metrics, passed = assert_identical(reference, candidate, ONNX_TOLERANCE)
        assert not passed and "non-finite" in metrics["error"]


def test_zeros_where_the_relative_error_has_no_scale():
    reference = torch.zeros(3, 50)
    reference[:, ::2] = torch.randn(3, 25, generator=generator())
    assert_identical(reference, near(reference, 1e-4), ONNX_TOLERANCE)
    assert_identical(torch.zeros(4, 10), torch.zeros(4, 10), ONNX_TOLERANCE)


def test_tolerances_at_their_very_edge():
    # values exactly representable: |eager| = 2, atol + rtol * 2 = 1.0, so diff 1.0 passes and one ulp more fails
    tolerance = Tolerance(atol=0.5, rtol=0.25)
    reference = torch.full((2, 6), 2.0, dtype=torch.float64)
    at_edge = torch.full((2, 6), 3.0, dtype=torch.float64)
    metrics, passed = assert_identical(reference, at_edge, tolerance)
    assert passed and metrics["required_atol"] == 0.5 and metrics["required_rtol"] == 0.25
    over = at_edge.clone()
    over[1, 4] = math.nextafter(3.0, math.inf)
    _, passed = assert_identical(reference, over, tolerance)
    assert not passed


def test_random_elements_on_both_sides_of_the_bound():
    reference = torch.randn(4, 21, 20, 30, generator=generator(), dtype=torch.float64)
    bound = ONNX_TOLERANCE.atol + ONNX_TOLERANCE.rtol * reference.abs()
    sign = torch.randint(0, 2, reference.shape, generator=generator(4)) * 2 - 1
    for nudge in (1 - 1e-15, 1.0, 1 + 1e-15):
        assert_identical(reference, reference + sign * bound * nudge, ONNX_TOLERANCE)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_integer_outputs(dtype):
    reference = torch.randint(0, 2 if dtype == torch.bool else 200, (3, 7, 5, 6), generator=generator()).to(dtype)
    candidate = reference.clone()
    candidate[0, 0, 0, :3] = candidate[0, 0, 0, :3] ^ 1 if dtype == torch.bool else candidate[0, 0, 0, :3] // 2
    assert_identical(reference, candidate, ONNX_TOLERANCE)
    assert_identical(reference, reference.clone(), TORCHSCRIPT_TOLERANCE)


def test_other_layouts_and_float64_inputs():
    reference = torch.randn(2, 21, 30, 40, generator=generator())
    candidate = near(reference, 1e-5)
    last = torch.channels_last
    assert_identical(reference.to(memory_format=last), candidate.to(memory_format=last), ONNX_TOLERANCE)
    assert_identical(reference, candidate.to(memory_format=last), ONNX_TOLERANCE)
    assert_identical(reference.transpose(2, 3), candidate.transpose(2, 3), ONNX_TOLERANCE)
    assert_identical(reference.double(), candidate.double(), ONNX_TOLERANCE)
    assert_identical(reference.half(), candidate.half(), ONNX_TOLERANCE)


def test_small_shapes():
    assert_identical(torch.tensor(1.5), torch.tensor(1.5001), ONNX_TOLERANCE)
    assert_identical(torch.tensor([2.0]), torch.tensor([-2.0]), ONNX_TOLERANCE)
    assert_identical(torch.randn(7, generator=generator()), torch.randn(7, generator=generator(5)), ONNX_TOLERANCE)


def test_different_shapes_are_one_error():
    for a, b in (((2, 3), (3, 2)), ((1, 21, 8, 8), (1, 21, 8, 9)), ((4,), (4, 1))):
        expected = plain_compare(torch.zeros(a), torch.zeros(b), ONNX_TOLERANCE)
        assert compare_outputs(torch.zeros(a), torch.zeros(b), ONNX_TOLERANCE) == expected


def test_detections_including_none_found_take_the_sets_path():
    boxes = torch.tensor([[1.0, 2.0, 30.0, 40.0], [5.0, 5.0, 9.0, 9.0]])
    found = (boxes, torch.tensor([1, 2]), torch.tensor([0.9, 0.6]))
    nothing = (torch.zeros(0, 4), torch.zeros(0, dtype=torch.int64), torch.zeros(0))
    tolerance = replace(SAME_KERNELS_SETS, limits=DetectionLimits(0.5, 100))
    for reference, candidate in ((found, found), (nothing, nothing), (found, nothing), (nothing, found)):
        assert compare_outputs(reference, candidate, tolerance) == plain_compare(reference, candidate, tolerance)
