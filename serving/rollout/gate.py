"""The agreement gate: the live version and the candidate answer the same held-out photos over real HTTP, and the
task's own comparator judges each pair against declared thresholds.

The photos are the export's held-out half (export/precision/calibration.py: scikit-image photographs the
calibration never saw, whole and cropped), sent as PNG as a client sends them. A classifier's pair agrees when
the candidate's top-1 is the live top-1 and it keeps most of its top-5; a detector's when its boxes match the
live set (export.checks.detections, the export's own set comparison); a segmenter's when every class's mask
overlaps the live mask (mask IoU). What disagrees is named: the photo and how, in the two versions' names
("v3 finds 2 boxes v2 does not").
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from contract.records import CLASSIFICATION, DETECTION, SEGMENTATION, DetectionLimits

# Declared thresholds: the share of photos that must agree, and what agreeing means per task. A retrained model
# may move near-ties; it may not change what most photos are.
MIN_AGREEING_SHARE = 0.9  # photos whose answers agree, over all photos sent
MIN_TOP5_OVERLAP = 3  # of the live top-5 labels, at least this many in the candidate's top-5
DETECTION_BOX_IOU = 0.9  # a candidate box matches a live one of the same label from this IoU
DETECTION_SCORE_ATOL = 0.05  # matched scores within this
MIN_MASK_IOU = 0.9  # each class's mask against the live one
PHOTO_COUNT = 10  # held-out photos sent to both versions: enough for a 0.9 share to mean one disagreement


class Sides(NamedTuple):
    """The two versions a comparison names: the live one and the candidate."""

    live: str = "the live version"
    candidate: str = "the candidate"


UNNAMED = Sides()  # a comparison asked without the versions' labels


@dataclass
class PhotoVerdict:
    photo: str
    agrees: bool
    how: str  # "top-1 cat (cat)", "3 boxes vs 3, 3 matched", or why not


@dataclass
class GateResult:
    task: str
    live: str
    candidate: str
    verdicts: list[PhotoVerdict] = field(default_factory=list)

    @property
    def share(self) -> float:
        return sum(v.agrees for v in self.verdicts) / max(len(self.verdicts), 1)

    @property
    def passed(self) -> bool:
        return bool(self.verdicts) and self.share >= MIN_AGREEING_SHARE

    def table(self) -> str:
        width = max(len(v.photo) for v in self.verdicts) if self.verdicts else 5
        lines = [f"{'photo':<{width}}  agrees  {self.live} vs {self.candidate}",
                 *(f"{v.photo:<{width}}  {'yes' if v.agrees else 'NO':<6}  {v.how}" for v in self.verdicts),
                 f"{len(self.verdicts)} photos, {self.share:.0%} agree (threshold {MIN_AGREEING_SHARE:.0%}, "
                 f"{describe_rule(self.task)}): {'passed' if self.passed else 'FAILED'}"]
        return "\n".join(lines)

    def disagreements(self) -> str:
        return "; ".join(f"{v.photo}: {v.how}" for v in self.verdicts if not v.agrees)


def describe_rule(task: str) -> str:
    return {CLASSIFICATION: f"same top-1, >= {MIN_TOP5_OVERLAP} of the top-5 kept",
            DETECTION: f"boxes matched at IoU >= {DETECTION_BOX_IOU}, scores within {DETECTION_SCORE_ATOL}",
            SEGMENTATION: f"every class's mask IoU >= {MIN_MASK_IOU}"}[task]


def held_out_photos(count: int = PHOTO_COUNT) -> list[tuple[str, bytes]]:
    """(name, PNG bytes): the export's held-out photographs, whole then cropped, as a client would send them."""
    from export.checks.phone_photos import sample_photo
    from export.precision.calibration import HOLDOUT_PHOTOS, PHOTO_CROPS, _crop, _png_bytes
    photos = []
    for crop_index, crop in enumerate(PHOTO_CROPS):
        for name in HOLDOUT_PHOTOS:
            if len(photos) < count:
                photos.append((f"{name}#{crop_index}", _png_bytes(_crop(sample_photo(name), crop))))
    return photos


def run_gate(task: str, live: str, candidate: str, ask_live: Callable[[bytes], dict],
             ask_candidate: Callable[[bytes], dict], photos: list[tuple[str, bytes]]) -> GateResult:
    """Both versions' answers to each photo (ask_*: one real HTTP request each), compared by the task's rule."""
    compare, sides = COMPARATORS[task], Sides(live, candidate)
    result = GateResult(task, live, candidate)
    for name, image in photos:
        agrees, how = compare(ask_live(image), ask_candidate(image), sides)
        result.verdicts.append(PhotoVerdict(name, agrees, how))
    return result


# ---------------------------------------------------------------- the task's comparators, on served answers
def compare_classes(live: dict, candidate: dict, sides: Sides = UNNAMED) -> tuple[bool, str]:
    ours, theirs = [p["label"] for p in live["predictions"]], [p["label"] for p in candidate["predictions"]]
    if not ours or not theirs:
        return False, f"{sides.live} names {len(ours)} classes, {sides.candidate} {len(theirs)}"
    kept = len(set(ours[:5]) & set(theirs[:5]))
    needed = min(MIN_TOP5_OVERLAP, len(ours[:5]))
    agrees = ours[0] == theirs[0] and kept >= needed
    top1 = (f"top-1 {ours[0]} on both" if ours[0] == theirs[0]
            else f"top-1 {theirs[0]} on {sides.candidate}, {ours[0]} on {sides.live}")
    return agrees, f"{top1}; {sides.candidate} keeps {kept} of {sides.live}'s top-5"


def compare_boxes(live: dict, candidate: dict, sides: Sides = UNNAMED) -> tuple[bool, str]:
    from export.checks.detections import compare_detections
    from export.forms.tolerances import SetTolerance
    tolerance = SetTolerance(box_iou=DETECTION_BOX_IOU, score_atol=DETECTION_SCORE_ATOL, edge=0.0, mask_iou=0.0)
    no_cut = DetectionLimits(score_threshold=0.0, max_detections=1 << 30)  # both answers are as served: no edge
    found = compare_detections(detections_of(live), detections_of(candidate), tolerance, no_cut)
    how = (f"{sides.candidate} finds {found.candidate_count} boxes, {sides.live} {found.reference_count}, "
           f"{found.matched} matched")
    if found.passed:
        return True, how
    why = []
    if found.missing:
        why.append(f"{sides.candidate} misses {len(found.missing)} boxes {sides.live} finds (highest score "
                   f"{max(box['score'] for box in found.missing):.3f})")
    if found.extra:
        why.append(f"{sides.candidate} finds {len(found.extra)} boxes {sides.live} does not (highest score "
                   f"{max(box['score'] for box in found.extra):.3f})")
    if found.worst_score_diff is not None and found.worst_score_diff > DETECTION_SCORE_ATOL:
        why.append(f"a matched box's score differs by {found.worst_score_diff:.3g} between them (tolerance "
                   f"{DETECTION_SCORE_ATOL:g})")
    return False, how + ": " + "; ".join(why)


def detections_of(answer: dict):
    import torch

    from export.checks.detections import Detections
    found = answer["detections"]
    return Detections(torch.tensor([d["box"] for d in found], dtype=torch.float32).reshape(-1, 4),
                      torch.tensor([d.get("index", 0) for d in found], dtype=torch.int64),
                      torch.tensor([d["score"] for d in found], dtype=torch.float32))


def compare_masks(live: dict, candidate: dict, sides: Sides = UNNAMED) -> tuple[bool, str]:
    from export.checks.detections import mask_iou
    ours, theirs = class_map(live), class_map(candidate)
    if ours.shape != theirs.shape:
        return False, (f"{sides.candidate}'s class map is {tuple(theirs.shape)}, {sides.live}'s "
                       f"{tuple(ours.shape)}")
    classes = sorted(set(ours.unique().tolist()) | set(theirs.unique().tolist()))
    ious = {index: mask_iou((ours == index).float(), (theirs == index).float()) for index in classes}
    worst = min(ious, key=lambda index: ious[index])
    return ious[worst] >= MIN_MASK_IOU, (f"{sides.candidate}'s mask of class {worst} overlaps {sides.live}'s by IoU "
                                         f"{ious[worst]:.3f} (the worst of {len(classes)} classes)")


def class_map(answer: dict):
    import numpy as np
    import torch
    from PIL import Image
    return torch.from_numpy(np.array(Image.open(io.BytesIO(base64.b64decode(answer["class_map_png"])))))


COMPARATORS = {CLASSIFICATION: compare_classes, DETECTION: compare_boxes, SEGMENTATION: compare_masks}
# What each task's gate asks for beyond the photo: a segmenter's class map as PNG (the masks' own comparison).
REQUEST_HEADERS = {CLASSIFICATION: {"X-TopK": "5"}, DETECTION: {}, SEGMENTATION: {"X-Masks": "png"}}
