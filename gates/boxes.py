"""A detector's comparator: two answers' boxes compared as sets of objects, not as tensors.

Two forms or versions of one detector may list the same boxes in another order, and rounding may move a box across
the model's score threshold or its cap on detections. So boxes are matched, per label, greedily from the highest
reference score to the candidate box of the same label that overlaps it most; a match needs the tolerance's box
IoU. Matched pairs are held to a score tolerance (and, with masks, a mask IoU after binarising at 0.5). A box that
found no partner is excused only when it sits AT THE EDGE: its score within `edge` of where the other side stopped
keeping boxes (the score threshold, or, when the other side hit the cap, its lowest kept score). Every other
unmatched box, and every count difference it makes, fails. A photo is evidence when either side finds a box: two
empty answers agree on nothing. Export's parity and precision gate hold tensors to it (export.checks.detections),
the rollout two served answers (compare_served_boxes).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torchvision.ops import box_iou

from contract.records import DetectionLimits as Limits
from gates.masks import mask_iou
from gates.verdict import EAGER_AND_FORM, LIVE_AND_CANDIDATE, Sides, Verdict

FLAT_BOX_ATOL = 0.01  # pixels: boxes whose corners all agree this closely are one box (a flat box has no IoU)
NO_CUT = Limits(score_threshold=0.0, max_detections=1 << 30)  # two served answers: each is as served, no edge


@dataclass(frozen=True)
class SetTolerance:
    """Matched per label from this box IoU, matched scores within score_atol (and masks from mask_iou), a box left
    over excused only within `edge` of where the other side stopped keeping boxes (its `limits`)."""

    box_iou: float
    score_atol: float
    edge: float
    mask_iou: float
    limits: Limits | None = None

    def describe(self) -> str:
        return f"box IoU >= {self.box_iou:g}, scores within {self.score_atol:g}"


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

    @classmethod
    def served(cls, answer: dict) -> Detections:
        """A served answer's `detections` (box, index, score each)."""
        found = answer["detections"]
        return cls(torch.tensor([d["box"] for d in found], dtype=torch.float32).reshape(-1, 4),
                   torch.tensor([d.get("index", 0) for d in found], dtype=torch.int64),
                   torch.tensor([d["score"] for d in found], dtype=torch.float32))

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
    sides: Sides = EAGER_AND_FORM

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def evidence(self) -> bool:
        """Whether either side found a box: two empty answers agree on nothing."""
        return bool(self.reference_count or self.candidate_count)

    def line(self) -> str:
        counts = (f"{self.sides.candidate} finds {self.candidate_count} boxes, {self.sides.reference} "
                  f"{self.reference_count}, {self.matched} matched")
        edge = f", {self.at_edge} at the edge" if self.at_edge else ""
        return counts + edge + ("" if self.passed else ": " + "; ".join(self.failures))

    def as_dict(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "sides"}, "passed": self.passed}


def compare_detections(reference: Detections, candidate: Detections, tolerance: SetTolerance,
                       limits: Limits, sides: Sides = EAGER_AND_FORM) -> SetComparison:
    pairs = match_boxes(reference, candidate, tolerance.box_iou)
    result = SetComparison(len(reference), len(candidate), len(pairs), sides=sides)
    _hold_pairs(result, reference, candidate, pairs, tolerance)
    _left_over(result, reference, candidate, pairs, tolerance.edge, limits)
    return result


def compare_served_boxes(reference: dict, candidate: dict, box_iou_min: float, score_atol: float,
                         sides: Sides = LIVE_AND_CANDIDATE) -> Verdict:
    """Two served answers' detections, each as served (no edge excused)."""
    tolerance = SetTolerance(box_iou=box_iou_min, score_atol=score_atol, edge=0.0, mask_iou=0.0)
    found = compare_detections(Detections.served(reference), Detections.served(candidate), tolerance, NO_CUT, sides)
    return Verdict(found.passed, found.line(), found.evidence)


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
    sides = result.sides
    refs, cands = [p[0] for p in pairs], [p[1] for p in pairs]
    result.worst_box_iou = min(p[2] for p in pairs)
    result.mean_box_iou = sum(p[2] for p in pairs) / len(pairs)
    result.worst_score_diff = float((reference.scores[refs] - candidate.scores[cands]).abs().max())
    if result.worst_score_diff > tolerance.score_atol:
        result.failures.append(f"a matched score differs by {result.worst_score_diff:.3g} between "
                               f"{sides.reference} and {sides.candidate} (tolerance {tolerance.score_atol:g})")
    if tolerance.mask_iou and reference.masks is not None and candidate.masks is not None:
        result.worst_mask_iou = min(mask_iou(reference.masks[r], candidate.masks[c]) for r, c in zip(refs, cands))
        if result.worst_mask_iou < tolerance.mask_iou:
            result.failures.append(f"{sides.candidate}'s matched mask overlaps {sides.reference}'s by IoU "
                                   f"{result.worst_mask_iou:.3f} (tolerance {tolerance.mask_iou:g})")


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
    sides = result.sides
    if result.missing:
        result.failures.append(f"{sides.candidate} misses {len(result.missing)} boxes {sides.reference} finds "
                               f"(highest score {max(b['score'] for b in result.missing):.3f})")
    if result.extra:
        result.failures.append(f"{sides.candidate} finds {len(result.extra)} boxes {sides.reference} does not "
                               f"(highest score {max(b['score'] for b in result.extra):.3f})")


def cut_score(detections: Detections, limits: Limits) -> float:
    """Where this side stopped keeping boxes: its lowest kept score when the cap was reached, else the threshold."""
    if len(detections) >= limits.max_detections:
        return float(detections.scores.min())
    return limits.score_threshold
