"""A segmenter's two served class maps compared (gates.masks.compare_class_maps): every class's mask IoU, in the
versions' names; two maps of background alone carry no evidence."""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image

from gates.masks import compare_class_maps
from gates.verdict import Sides


def class_map_answer(array: np.ndarray) -> dict:
    buffer = io.BytesIO()
    Image.fromarray(array.astype(np.uint8)).save(buffer, format="PNG")
    return {"class_map_png": base64.b64encode(buffer.getvalue()).decode()}


def test_a_segmenter_agrees_when_every_class_mask_overlaps():
    live, moved = np.zeros((20, 20)), np.zeros((20, 20))
    live[5:15, 5:15] = 3
    moved[10:20, 10:20] = 3
    same = compare_class_maps(class_map_answer(live), class_map_answer(live.copy()), 0.9)
    assert same.agrees and same.evidence
    apart = compare_class_maps(class_map_answer(live), class_map_answer(moved), 0.9, Sides("v2", "v3"))
    assert not apart.agrees and apart.how.startswith("v3's mask of class 3 overlaps v2's by IoU 0.143")


def test_background_alone_is_no_evidence():
    empty = class_map_answer(np.zeros((20, 20)))
    nothing = compare_class_maps(empty, empty, 0.9)
    assert nothing.agrees and not nothing.evidence
