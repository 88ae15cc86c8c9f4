"""Boxes compared as sets (gates.boxes, parity's and the rollout's comparator): matched by label and IoU in any
order, scores and masks held to a tolerance, a box left over excused only at the edge of the other side's cut; two
served answers compared in the versions' names, a photo where neither finds a box carrying no evidence."""

from __future__ import annotations

import torch

from contract.records import DetectionLimits as Limits
from gates.boxes import Detections, SetTolerance, compare_detections, compare_served_boxes, cut_score
from gates.masks import mask_iou
from gates.verdict import Sides

TOLERANCE = SetTolerance(box_iou=0.9, score_atol=1e-3, edge=1e-3, mask_iou=0.9)
LIMITS = Limits(score_threshold=0.05, max_detections=100)


def boxes(*rows) -> Detections:
    """rows of (x1, y1, x2, y2, label, score)."""
    table = torch.tensor([list(r) for r in rows], dtype=torch.float32).reshape(-1, 6)
    return Detections(table[:, :4], table[:, 4].long(), table[:, 5])


EAGER = boxes((0, 0, 10, 10, 1, 0.9), (20, 20, 40, 40, 2, 0.8), (50, 0, 60, 30, 1, 0.3))


def test_the_same_boxes_in_another_order_pass():
    shuffled = boxes((50, 0, 60, 30, 1, 0.3), (0, 0, 10, 10, 1, 0.9), (20, 20, 40, 40, 2, 0.8))
    result = compare_detections(EAGER, shuffled, TOLERANCE, LIMITS)
    assert result.passed and result.matched == 3 and result.worst_box_iou == 1.0 and result.worst_score_diff == 0


def test_a_moved_box_a_changed_label_or_score_fails_and_says_which():
    moved = boxes((0, 0, 10, 10, 1, 0.9), (25, 25, 45, 45, 2, 0.8), (50, 0, 60, 30, 1, 0.3))
    result = compare_detections(EAGER, moved, TOLERANCE, LIMITS)
    assert not result.passed and result.matched == 2
    assert result.missing == [{"label": 2, "score": 0.8, "box": [20.0, 20.0, 40.0, 40.0]}]
    assert result.extra[0]["box"] == [25.0, 25.0, 45.0, 45.0] and "the form misses 1 boxes eager finds" in result.line()
    relabelled = boxes((0, 0, 10, 10, 3, 0.9), (20, 20, 40, 40, 2, 0.8), (50, 0, 60, 30, 1, 0.3))
    assert compare_detections(EAGER, relabelled, TOLERANCE, LIMITS).missing[0]["label"] == 1
    rescored = boxes((0, 0, 10, 10, 1, 0.95), (20, 20, 40, 40, 2, 0.8), (50, 0, 60, 30, 1, 0.3))
    failed = compare_detections(EAGER, rescored, TOLERANCE, LIMITS)
    assert failed.matched == 3 and not failed.passed and "matched score differs by 0.05" in failed.failures[0]


def test_a_box_at_the_threshold_may_be_on_one_side_only_and_no_other():
    with_edge = boxes(*[(0, 0, 10, 10, 1, 0.9), (20, 20, 40, 40, 2, 0.8), (50, 0, 60, 30, 1, 0.3),
                        (70, 70, 80, 80, 4, 0.0505)])
    result = compare_detections(EAGER, with_edge, TOLERANCE, LIMITS)
    assert result.passed and result.at_edge == 1 and result.candidate_count == 4
    above_edge = boxes(*[(0, 0, 10, 10, 1, 0.9), (20, 20, 40, 40, 2, 0.8), (50, 0, 60, 30, 1, 0.3),
                         (70, 70, 80, 80, 4, 0.2)])
    assert not compare_detections(EAGER, above_edge, TOLERANCE, LIMITS).passed
    assert not compare_detections(EAGER, boxes(), TOLERANCE, LIMITS).passed  # nothing where eager finds three
    assert compare_detections(boxes(), boxes(), TOLERANCE, LIMITS).passed  # nothing on both sides: equal


def test_when_the_cap_is_reached_the_lowest_kept_score_is_the_cut():
    capped = Limits(score_threshold=0.05, max_detections=3)
    assert cut_score(EAGER, capped) == torch.tensor(0.3).item() and cut_score(EAGER, LIMITS) == 0.05
    dropped_for_a_near_tie = boxes((0, 0, 10, 10, 1, 0.9), (20, 20, 40, 40, 2, 0.8), (90, 90, 99, 99, 5, 0.3004))
    result = compare_detections(EAGER, dropped_for_a_near_tie, TOLERANCE, capped)
    assert result.passed and result.at_edge == 2  # each side's third box ties the other's cut


def test_masks_are_compared_by_iou_after_binarising():
    square = torch.zeros(1, 1, 20, 20)
    square[..., 5:15, 5:15] = 0.9
    shifted = torch.roll(square, shifts=3, dims=3)
    assert mask_iou(square[0], square[0]) == 1.0 and abs(mask_iou(square[0], shifted[0]) - 70 / 130) < 1e-6
    one = boxes((0, 0, 10, 10, 1, 0.9))
    same = compare_detections(Detections(one.boxes, one.labels, one.scores, square),
                              Detections(one.boxes, one.labels, one.scores, square), TOLERANCE, LIMITS)
    moved = compare_detections(Detections(one.boxes, one.labels, one.scores, square),
                               Detections(one.boxes, one.labels, one.scores, shifted), TOLERANCE, LIMITS)
    assert same.passed and same.worst_mask_iou == 1.0 and not moved.passed and "mask overlaps" in moved.failures[0]


def test_a_flat_box_matches_itself():
    flat = boxes((5, 5, 5, 20, 1, 0.7), (0, 0, 10, 10, 2, 0.6))  # zero width: IoU with itself is 0 / 0
    assert compare_detections(flat, flat, TOLERANCE, LIMITS).matched == 2
    rounded = boxes((5, 5.0004, 5, 20.0003, 1, 0.7), (0, 0, 10, 10, 2, 0.6))
    assert compare_detections(flat, rounded, TOLERANCE, LIMITS).passed
    moved = boxes((6, 5, 6, 20, 1, 0.7), (0, 0, 10, 10, 2, 0.6))
    assert not compare_detections(flat, moved, TOLERANCE, LIMITS).passed


def served(*found: tuple[list[float], int, float]) -> dict:
    return {"detections": [{"box": box, "index": index, "label": str(index), "score": score}
                           for box, index, score in found]}


def test_two_served_answers_are_compared_in_the_versions_names():
    versions, live = Sides("v2", "v3"), served(([10, 10, 50, 50], 1, 0.9), ([60, 60, 90, 90], 2, 0.8))
    assert compare_served_boxes(live, served(([10, 10, 50, 50.5], 1, 0.91), ([60, 60, 90, 90], 2, 0.8)), 0.9, 0.05).agrees
    fewer = compare_served_boxes(live, served(([10, 10, 50, 50], 1, 0.9)), 0.9, 0.05, versions)
    assert not fewer.agrees and fewer.evidence
    assert fewer.how == "v3 finds 1 boxes, v2 2, 1 matched: v3 misses 1 boxes v2 finds (highest score 0.800)"
    many = compare_served_boxes(live, served(*[([x, 10, x + 5, 15], 1, 0.5) for x in range(0, 300, 10)],
                                             ([10, 10, 50, 50], 1, 0.9), ([60, 60, 90, 90], 2, 0.8)), 0.9, 0.05, versions)
    assert not many.agrees and "v3 finds 30 boxes v2 does not (highest score 0.500)" in many.how
    assert "eager" not in many.how


def test_two_answers_without_a_box_agree_on_nothing():
    nothing = compare_served_boxes(served(), served(), 0.9, 0.05)
    assert nothing.agrees and not nothing.evidence  # vacuous: no evidence either way
    collapsed = compare_served_boxes(served(([10, 10, 50, 50], 1, 0.99)), served(), 0.9, 0.05)
    assert not collapsed.agrees and collapsed.evidence  # the live version finds a face the candidate does not
