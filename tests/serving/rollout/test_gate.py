"""The rollout's agreement gate (serving.rollout.gate) over the task comparators of gates/: what passes, what is
refused and named in the two versions' names, and a gate whose photos carried too little evidence, which judges
nothing however well the versions agree."""

from __future__ import annotations

from contract.records import CLASSIFICATION, DETECTION
from gates.photos import held_out_photos
from serving.rollout.gate import CONFIDENT_PROBABILITY, MIN_EVIDENCE_PHOTOS, run_gate


def classes(*labels: str, top1: float = 0.9) -> dict:
    return {"predictions": [{"label": label, "probability": top1 if not rank else 0.01}
                            for rank, label in enumerate(labels)]}


def boxes(*found) -> dict:
    return {"detections": [{"box": box, "index": 1, "label": "face", "score": 0.99} for box in found]}


def test_the_gate_names_the_photos_that_disagree():
    photos = held_out_photos(4)
    flipped = {photos[1][1]}
    result = run_gate(CLASSIFICATION, "v1", "v2", lambda image: classes("cat", "dog", "fox"),
                      lambda image: classes("dog", "cat", "fox") if image in flipped else classes("cat", "dog", "fox"),
                      photos)
    assert not result.passed and result.share == 0.75 and result.evidence == 4
    assert photos[1][0] in result.disagreements() and "FAILED" in result.table()
    assert "top-1 dog on v2, cat on v1" in result.disagreements()


def test_agreement_on_photos_without_evidence_proves_nothing():
    photos = held_out_photos(10)
    unsure = classes("cat", "dog", "fox", top1=CONFIDENT_PROBABILITY / 10)  # a random-weights classifier's answer
    vacuous = run_gate(CLASSIFICATION, "v1", "v2", lambda image: unsure, lambda image: unsure, photos)
    assert vacuous.agrees and not vacuous.passed and vacuous.evidence == 0
    assert "TOO LITTLE EVIDENCE" in vacuous.table()
    assert vacuous.too_little_evidence().startswith("only 0 of the 10 photos carried evidence")
    nothing = run_gate(DETECTION, "v1", "v2", lambda image: boxes(), lambda image: boxes(), photos)
    assert nothing.agrees and not nothing.passed  # two detectors that find nothing on photos of nothing


def test_the_share_is_counted_where_the_photos_carried_evidence():
    photos = held_out_photos(10)
    with_faces = {image for _, image in photos[:MIN_EVIDENCE_PHOTOS]}

    def live(image: bytes) -> dict:
        return boxes([10, 10, 50, 50]) if image in with_faces else boxes()

    same = run_gate(DETECTION, "v1", "v2", live, live, photos)
    assert same.passed and same.evidence == MIN_EVIDENCE_PHOTOS and "passed" in same.table()
    collapsed = run_gate(DETECTION, "v1", "v2", live, lambda image: boxes(), photos)  # finds no face at all
    assert not collapsed.agrees and collapsed.share == 0.0  # 7 empty photos "agreeing" do not hide it
    assert "v2 misses 1 boxes v1 finds" in collapsed.disagreements()
