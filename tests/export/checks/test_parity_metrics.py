import math

import pytest
import torch

from export.checks.parity import (
    UnderTest,
    compare_outputs,
    parity_inputs,
    run_parity,
    structured_images,
    topk_agreement,
)
from export.errors import ParityError
from export.forms.tolerances import ONNX_TOLERANCE, Tolerance
from runtime.base import ArtifactRunError


def test_topk_agreement_on_a_hand_built_case():
    reference = torch.tensor([[0.9, 0.5, 0.3, 0.1, 0.0, -1.0],
                              [0.1, 0.2, 0.3, 0.4, 0.5, 0.6],
                              [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
    candidate = torch.tensor([[0.9, 0.5, 0.3, 0.1, 0.0, -1.0],   # identical
                              [0.1, 0.2, 0.3, 0.4, 0.7, 0.6],     # top-1 swapped (index 4 beats 5), same top-5 set
                              [5.0, 4.0, 3.0, 2.0, -1.0, 0.5]])   # same top-1; index 5 enters top-5, 4 leaves
    assert topk_agreement(reference, candidate, 1) == pytest.approx(2 / 3)
    assert topk_agreement(reference, candidate, 5) == pytest.approx(2 / 3)
    assert topk_agreement(reference, candidate, 3) == pytest.approx(1.0)
    assert topk_agreement(reference[:, :4], candidate[:, :4], 5) is None


def test_metrics_and_smallest_passing_tolerances():
    reference = torch.tensor([[1.0, -2.0, 4.0]], dtype=torch.float64)
    candidate = torch.tensor([[1.0, -2.002, 4.0]], dtype=torch.float64)
    metrics, passed = compare_outputs(reference, candidate, Tolerance(atol=1e-4, rtol=1e-4))
    assert not passed
    assert metrics["max_abs"] == pytest.approx(0.002, rel=1e-6)
    assert metrics["max_rel"] == pytest.approx(0.001, rel=1e-6)
    assert metrics["required_atol"] == pytest.approx(0.002 - 1e-4 * 2.0, rel=1e-6)
    assert metrics["required_rtol"] == pytest.approx((0.002 - 1e-4) / 2.0, rel=1e-6)
    _, passes_with_needed = compare_outputs(reference, candidate, Tolerance(1e-4, metrics["required_rtol"] * 1.001))
    assert passes_with_needed
    assert metrics["cosine"] < 1.0 and metrics["top1_agreement"] == 1.0


def test_shape_mismatch_and_nan_fail():
    metrics, passed = compare_outputs(torch.zeros(2, 3), torch.zeros(3, 2), ONNX_TOLERANCE)
    assert not passed and "shape" in metrics["error"]
    metrics, passed = compare_outputs(torch.zeros(1, 3), torch.tensor([[0.0, math.nan, 0.0]]), ONNX_TOLERANCE)
    assert not passed


def test_inputs_cover_batches_structure_and_other_sizes():
    batches = parity_inputs((1, 3, 32, 32), spatial_dynamic=True)
    shapes = {b.name: tuple(b.tensor.shape) for b in batches}
    assert {s[0] for s in shapes.values()} == {1, 2, 8}
    assert any(s[2:] != (32, 32) for s in shapes.values())
    assert all(0.0 <= b.tensor.min() and b.tensor.max() <= 1.0 for b in batches)
    images = structured_images(4, 3, 32, 32)
    assert images.shape == (4, 3, 32, 32) and images.std() > 0.05  # not flat noise-free zeros


def test_run_parity_raises_typed_error_with_numbers():
    def eager(x):  # any callable runs like a backend
        return x.sum(dim=(2, 3))

    def off(x):
        return x.sum(dim=(2, 3)) + 0.5
    report = run_parity(eager, {"good": UnderTest(eager, ONNX_TOLERANCE, False),
                                "bad": UnderTest(off, ONNX_TOLERANCE, False)}, parity_inputs((1, 3, 8, 8)))
    assert report.passed("good") and not report.passed("bad")
    with pytest.raises(ParityError) as error:
        report.raise_on_failure()
    assert {c.artifact for c in error.value.failures} == {"bad"}
    assert error.value.failures[0].metrics["max_abs"] == pytest.approx(0.5, rel=1e-5)
    assert "max_abs=0.5" in str(error.value) and "| bad |" in error.value.table


def test_each_candidate_is_held_to_its_own_tolerance_and_size_claim():
    def eager(x):
        return x.sum(dim=(2, 3))

    def close(x):  # within 1e-2, outside 1e-4
        return x.sum(dim=(2, 3)) + 1e-3
    inputs = parity_inputs((1, 3, 8, 8), spatial_dynamic=True)
    report = run_parity(eager, {"loose": UnderTest(close, Tolerance(atol=1e-2, rtol=0.0), True),
                                "tight": UnderTest(close, Tolerance(atol=1e-4, rtol=0.0), False)}, inputs)
    assert report.passed("loose") and not report.passed("tight")
    assert report.summary()["loose"]["tolerance"] == {"atol": 1e-2, "rtol": 0.0}
    # only the candidate claiming other spatial sizes is run on the other-size batch
    assert report.summary()["loose"]["inputs"] == len(inputs) == report.summary()["tight"]["inputs"] + 1
    assert "fixed input size" in report.skipped["tight"]


def test_an_artifact_that_refuses_an_input_fails_parity_with_its_cause():
    def eager(x):
        return x.sum(dim=(2, 3))

    def refuses(x):
        try:
            raise ValueError(f"cannot take {tuple(x.shape)}")
        except ValueError as error:
            raise ArtifactRunError("refuses failed on this input") from error

    report = run_parity(eager, {"refuses": UnderTest(refuses, ONNX_TOLERANCE, False)}, parity_inputs((1, 3, 8, 8)))
    assert not report.passed("refuses")
    metrics = report.failures[0].metrics
    assert "refuses failed on this input" in metrics["error"]
    assert "ValueError: cannot take (1, 3, 8, 8)" in metrics["traceback"]  # the runtime's own traceback is kept
    with pytest.raises(ParityError):
        report.raise_on_failure()
