"""A classifier's two served answers compared (gates.topk.compare_ranked): same top-1 and most of the top-5, in the
versions' names; a photo is evidence only where the reference is confident of its top-1."""

from __future__ import annotations

from gates.topk import compare_ranked
from gates.verdict import Sides

VERSIONS = Sides("v2", "v3")


def classes(*labels: str, top1: float = 0.9) -> dict:
    return {"predictions": [{"label": label, "probability": top1 if not rank else 0.01}
                            for rank, label in enumerate(labels)]}


def test_a_classifier_agrees_on_its_top1_and_most_of_its_top5():
    assert compare_ranked(classes("cat", "dog", "fox", "owl", "bee"), classes("cat", "fox", "dog", "elk", "ant"),
                          3, 0.5).agrees
    flipped = compare_ranked(classes("cat", "dog", "fox", "owl", "bee"), classes("dog", "cat", "fox", "owl", "bee"),
                             3, 0.5, VERSIONS)
    assert not flipped.agrees and flipped.how == "top-1 dog on v3, cat on v2 (v2 90% sure); v3 keeps 5 of v2's top-5"
    assert not compare_ranked(classes("cat", "dog", "fox", "owl", "bee"), classes("cat", "a", "b", "c", "d"),
                              3, 0.5).agrees


def test_only_a_confident_reference_makes_a_photo_evidence():
    sure, unsure = classes("cat", "dog", top1=0.6), classes("cat", "dog", top1=0.004)  # unsure: random weights
    assert compare_ranked(sure, sure, 3, 0.5).evidence
    agreeing_on_noise = compare_ranked(unsure, unsure, 3, 0.5)
    assert agreeing_on_noise.agrees and not agreeing_on_noise.evidence
