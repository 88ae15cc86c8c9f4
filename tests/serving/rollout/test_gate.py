"""The agreement gate's comparators on served answers, and its verdict: what passes, what is refused and named, in
the two versions' names."""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image

from contract.records import CLASSIFICATION, DETECTION
from serving.rollout.gate import Sides, compare_boxes, compare_classes, compare_masks, held_out_photos, run_gate

VERSIONS = Sides("v2", "v3")


def classes(*labels: str) -> dict:
    return {"predictions": [{"label": label, "probability": 0.1} for label in labels]}


def test_a_classifier_agrees_on_its_top1_and_most_of_its_top5():
    assert compare_classes(classes("cat", "dog", "fox", "owl", "bee"), classes("cat", "fox", "dog", "elk", "ant"))[0]
    agrees, how = compare_classes(classes("cat", "dog", "fox", "owl", "bee"), classes("dog", "cat", "fox", "owl", "bee"),
                                  VERSIONS)
    assert not agrees and how == "top-1 dog on v3, cat on v2; v3 keeps 5 of v2's top-5"
    assert not compare_classes(classes("cat", "dog", "fox", "owl", "bee"), classes("cat", "a", "b", "c", "d"))[0]


def boxes(*found: tuple[list[float], int, float]) -> dict:
    return {"detections": [{"box": box, "index": index, "label": str(index), "score": score}
                           for box, index, score in found]}


def test_a_detector_agrees_when_its_boxes_match():
    live = boxes(([10, 10, 50, 50], 1, 0.9), ([60, 60, 90, 90], 2, 0.8))
    assert compare_boxes(live, boxes(([10, 10, 50, 50.5], 1, 0.91), ([60, 60, 90, 90], 2, 0.8)))[0]
    agrees, how = compare_boxes(live, boxes(([10, 10, 50, 50], 1, 0.9)), VERSIONS)
    assert not agrees and how == "v3 finds 1 boxes, v2 2, 1 matched: v3 misses 1 boxes v2 finds (highest score 0.800)"
    agrees, how = compare_boxes(live, boxes(*[([x, 10, x + 5, 15], 1, 0.5) for x in range(0, 300, 10)],
                                            ([10, 10, 50, 50], 1, 0.9), ([60, 60, 90, 90], 2, 0.8)), VERSIONS)
    assert not agrees and "v3 finds 30 boxes v2 does not (highest score 0.500)" in how
    assert "eager" not in how


def class_map_answer(array: np.ndarray) -> dict:
    buffer = io.BytesIO()
    Image.fromarray(array.astype(np.uint8)).save(buffer, format="PNG")
    return {"class_map_png": base64.b64encode(buffer.getvalue()).decode()}


def test_a_segmenter_agrees_when_every_class_mask_overlaps():
    live, moved = np.zeros((20, 20)), np.zeros((20, 20))
    live[5:15, 5:15] = 3
    moved[10:20, 10:20] = 3
    assert compare_masks(class_map_answer(live), class_map_answer(live.copy()))[0]
    agrees, how = compare_masks(class_map_answer(live), class_map_answer(moved), VERSIONS)
    assert not agrees and how.startswith("v3's mask of class 3 overlaps v2's by IoU 0.143")


def test_the_gate_names_the_photos_that_disagree():
    photos = held_out_photos(4)
    assert len(photos) == 4 and all(image[:4] == b"\x89PNG" for _, image in photos)
    flipped = {photos[1][1]}
    result = run_gate(CLASSIFICATION, "v1", "v2", lambda image: classes("cat", "dog", "fox"),
                      lambda image: classes("dog", "cat", "fox") if image in flipped else classes("cat", "dog", "fox"),
                      photos)
    assert not result.passed and result.share == 0.75
    assert photos[1][0] in result.disagreements() and "FAILED" in result.table()
    assert "top-1 dog on v2, cat on v1" in result.disagreements()
    same = run_gate(DETECTION, "v1", "v2", lambda image: boxes(), lambda image: boxes(), photos)
    assert same.passed and "passed" in same.table()
