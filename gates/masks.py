"""A segmenter's comparator, and the mask overlap a detector's masks (Mask R-CNN) are held to.

Two answers agree when every class's mask overlaps the reference's by a mask IoU; a photo is evidence when either
side finds foreground (a pixel of a class other than the background, index 0): two empty maps agree on nothing.
"""

from __future__ import annotations

import base64
import io

import torch

from gates.verdict import LIVE_AND_CANDIDATE, Sides, Verdict

MASK_THRESHOLD = 0.5  # torchvision's convention: a mask pixel belongs to the object above this probability
BACKGROUND = 0  # the class index torchvision's segmenters give the background


def mask_iou(first: torch.Tensor, second: torch.Tensor) -> float:
    a, b = first > MASK_THRESHOLD, second > MASK_THRESHOLD
    union = (a | b).sum().item()
    return 1.0 if union == 0 else (a & b).sum().item() / union


def compare_class_maps(reference: dict, candidate: dict, min_mask_iou: float,
                       sides: Sides = LIVE_AND_CANDIDATE) -> Verdict:
    """Two served answers' class maps (their `class_map_png`): every class's mask IoU at least min_mask_iou."""
    ours, theirs = class_map(reference), class_map(candidate)
    evidence = bool((ours != BACKGROUND).any() or (theirs != BACKGROUND).any())
    if ours.shape != theirs.shape:
        return Verdict(False, f"{sides.candidate}'s class map is {tuple(theirs.shape)}, {sides.reference}'s "
                              f"{tuple(ours.shape)}", evidence)
    classes = sorted(set(ours.unique().tolist()) | set(theirs.unique().tolist()))
    ious = {index: mask_iou((ours == index).float(), (theirs == index).float()) for index in classes}
    worst = min(ious, key=lambda index: ious[index])
    foreground = float((ours != BACKGROUND).float().mean())
    return Verdict(ious[worst] >= min_mask_iou,
                   f"{sides.candidate}'s mask of class {worst} overlaps {sides.reference}'s by IoU {ious[worst]:.3f} "
                   f"(the worst of {len(classes)} classes; {foreground:.0%} foreground on {sides.reference})",
                   evidence)


def class_map(answer: dict) -> torch.Tensor:
    """A served answer's class map (a PNG of class indices, base64) as an (H, W) tensor."""
    import numpy as np
    from PIL import Image
    return torch.from_numpy(np.array(Image.open(io.BytesIO(base64.b64decode(answer["class_map_png"])))))
