"""Parity for outputs that are sets: a detector's boxes compared with eager's as objects, not as tensors.

Two forms of one detector may list the same boxes in another order, and rounding may move a box across the
model's score threshold or its cap on detections. So boxes are matched, per label, greedily from the highest
reference score to the candidate box of the same label that overlaps it most; a match needs the family's box IoU.
Matched pairs are held to a score tolerance (and, with masks, a mask IoU after binarising at 0.5). A box that
found no partner is excused only when it sits AT THE EDGE: its score within `edge` of where the other side
stopped keeping boxes (the score threshold, or, when the other side hit the cap, its lowest kept score). Every
other unmatched box, and every count difference it makes, fails. Tolerances are declared per family, the way
Optimum declares ATOL_FOR_VALIDATION per model (`DETECTION_TOLERANCES`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torchvision.ops import box_iou

from contract.records import DetectionLimits as Limits
from export.forms.tolerances import SetTolerance

MASK_THRESHOLD = 0.5  # torchvision's convention: a mask pixel belongs to the object above this probability
FLAT_BOX_ATOL = 0.01  # pixels: boxes whose corners all agree this closely are one box (a flat box has no IoU)


@dataclass(frozen=True)
class Detections:
    """One image's answer in torchvision's conventions (the flattened outputs of models.detection)."""

    boxes: torch.Tensor  # N x 4, x1 y1 x2 y2
    labels: torch.Tensor  # N, int64
    scores: torch.Tensor  # N
    masks: torch.Tensor | None = None  # N x 1 x H x W probabilities

    @classmethod
    def of(cls, outputs) -> Detections:
        outputs = tuple(outputs)
        return cls(outputs[0].float(), outputs[1].long(), outputs[2].float(),
                   outputs[3].float() if len(outputs) > 3 else None)

    def __len__(self) -> int:
        return int(self.scores.numel())


@dataclass
class SetComparison:
    """The typed result: counts, matches, the boxes left over (each with label and score) and the worst pair."""

    reference_count: int
    candidate_count: int
    matched: int
    missing: list[dict] = field(default_factory=list)  # reference boxes with no partner, not excused
    extra: list[dict] = field(default_factory=list)  # candidate boxes with no partner, not excused
    at_edge: int = 0  # unmatched boxes excused: within the edge of the other side's cut
    worst_box_iou: float | None = None
    mean_box_iou: float | None = None
    worst_score_diff: float | None = None
    worst_mask_iou: float | None = None
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def line(self) -> str:
        counts = f"{self.candidate_count} boxes vs eager's {self.reference_count}, {self.matched} matched"
        edge = f", {self.at_edge} at the edge" if self.at_edge else ""
        return counts + edge + ("" if self.passed else ": " + "; ".join(self.failures))

    def as_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


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


def compare_detections(reference: Detections, candidate: Detections, tolerance: SetTolerance,
                       limits: Limits) -> SetComparison:
    pairs = match_boxes(reference, candidate, tolerance.box_iou)
    result = SetComparison(len(reference), len(candidate), len(pairs))
    _hold_pairs(result, reference, candidate, pairs, tolerance)
    _left_over(result, reference, candidate, pairs, tolerance.edge, limits)
    return result


def match_boxes(reference: Detections, candidate: Detections, min_iou: float) -> list[tuple[int, int, float]]:
    """(reference index, candidate index, IoU): greedy from the highest reference score, same label only."""
    if not len(reference) or not len(candidate):
        return []
    overlaps = box_iou(reference.boxes, candidate.boxes).nan_to_num(0.0)  # a flat box's IoU is 0 / 0
    corners = (reference.boxes[:, None, :] - candidate.boxes[None, :, :]).abs().amax(-1)
    overlaps[corners <= FLAT_BOX_ATOL] = 1.0  # the same box within rounding, flat ones too (no area to overlap)
    overlaps[reference.labels[:, None] != candidate.labels[None, :]] = -1.0
    taken: set[int] = set()
    pairs = []
    for r in torch.argsort(reference.scores, descending=True).tolist():
        row = overlaps[r].clone()
        row[list(taken)] = -1.0
        best = int(row.argmax())
        if row[best] >= min_iou:
            taken.add(best)
            pairs.append((r, best, float(row[best])))
    return pairs


def _hold_pairs(result: SetComparison, reference: Detections, candidate: Detections,
                pairs: list[tuple[int, int, float]], tolerance: SetTolerance) -> None:
    if not pairs:
        return
    refs, cands = [p[0] for p in pairs], [p[1] for p in pairs]
    result.worst_box_iou = min(p[2] for p in pairs)
    result.mean_box_iou = sum(p[2] for p in pairs) / len(pairs)
    result.worst_score_diff = float((reference.scores[refs] - candidate.scores[cands]).abs().max())
    if result.worst_score_diff > tolerance.score_atol:
        result.failures.append(f"a matched score differs by {result.worst_score_diff:.3g} "
                               f"(tolerance {tolerance.score_atol:g})")
    if tolerance.mask_iou and reference.masks is not None and candidate.masks is not None:
        result.worst_mask_iou = min(mask_iou(reference.masks[r], candidate.masks[c]) for r, c in zip(refs, cands))
        if result.worst_mask_iou < tolerance.mask_iou:
            result.failures.append(f"a matched mask overlaps eager's by IoU {result.worst_mask_iou:.3f} "
                                   f"(tolerance {tolerance.mask_iou:g})")


def _left_over(result: SetComparison, reference: Detections, candidate: Detections,
               pairs: list[tuple[int, int, float]], edge: float, limits: Limits) -> None:
    """The boxes with no partner: excused at the edge of the other side's cut, else failures."""
    for side, others, matched, listing in ((reference, candidate, {p[0] for p in pairs}, result.missing),
                                           (candidate, reference, {p[1] for p in pairs}, result.extra)):
        cut = cut_score(others, limits)
        for index in sorted(set(range(len(side))) - matched):
            score = float(side.scores[index])
            if score <= cut + edge:
                result.at_edge += 1
            else:
                listing.append({"label": int(side.labels[index]), "score": round(score, 4),
                                "box": [round(v, 1) for v in side.boxes[index].tolist()]})
    if result.missing:
        result.failures.append(f"{len(result.missing)} of eager's boxes missing (highest score "
                               f"{max(b['score'] for b in result.missing):.3f})")
    if result.extra:
        result.failures.append(f"{len(result.extra)} boxes eager does not give (highest score "
                               f"{max(b['score'] for b in result.extra):.3f})")


def cut_score(detections: Detections, limits: Limits) -> float:
    """Where this side stopped keeping boxes: its lowest kept score when the cap was reached, else the threshold."""
    if len(detections) >= limits.max_detections:
        return float(detections.scores.min())
    return limits.score_threshold


def mask_iou(first: torch.Tensor, second: torch.Tensor) -> float:
    a, b = first > MASK_THRESHOLD, second > MASK_THRESHOLD
    union = (a | b).sum().item()
    return 1.0 if union == 0 else (a & b).sum().item() / union
