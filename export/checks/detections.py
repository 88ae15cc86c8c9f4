"""Parity for outputs that are sets: a detector's boxes compared with eager's as objects (gates.boxes, the
family's SetTolerance from the kinds table), reported in parity's metrics."""

from __future__ import annotations

from gates.boxes import Detections, SetTolerance, compare_detections


def compare_sets(reference, candidate, tolerance: SetTolerance) -> tuple[dict, bool]:
    """Parity's comparison of two detectors' outputs (tuples of tensors): metrics in parity's shape (max_abs is
    the largest matched-score difference) plus the set's own, and whether the candidate passed."""
    found = compare_detections(Detections.of(reference), Detections.of(candidate), tolerance, tolerance.limits)
    metrics = {"max_abs": found.worst_score_diff or 0.0, "max_rel": None, "cosine": None, "boxes": found.candidate_count,
               "eager_boxes": found.reference_count, "matched": found.matched, "at_edge": found.at_edge,
               "worst_box_iou": found.worst_box_iou, "worst_mask_iou": found.worst_mask_iou,
               "missing": found.missing[:5], "extra": found.extra[:5]}
    if not found.passed:
        metrics["error"] = found.line()
    return metrics, found.passed
