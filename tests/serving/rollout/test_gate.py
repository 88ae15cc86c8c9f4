"""The rollout's agreement gate (serving.rollout.gate) over the task comparators of gates/: what passes, what is
refused and named in the two versions' names, a gate whose photos carried too little evidence, which judges
nothing however well the versions agree, and which photos it is given (said in its report)."""

from __future__ import annotations

from contract.records import CLASSIFICATION, DETECTION
from gates.photos import held_out_photos, png_bytes, sample_photo
from serving.rollout.candidate import prepare
from serving.rollout.gate import CONFIDENT_PROBABILITY, MIN_EVIDENCE_PHOTOS, PHOTO_COUNT, Photos, photos_for, run_gate
from tests.serving.rollout.test_candidate import archive


def classes(*labels: str, top1: float = 0.9) -> dict:
    return {"predictions": [{"label": label, "probability": top1 if not rank else 0.01}
                            for rank, label in enumerate(labels)]}


def boxes(*found) -> dict:
    return {"detections": [{"box": box, "index": 1, "label": "face", "score": 0.99} for box in found]}


def test_the_gate_names_the_photos_that_disagree():
    photos = photos_for(4)
    flipped = {photos.items[1][1]}
    result = run_gate(CLASSIFICATION, "v1", "v2", lambda image: classes("cat", "dog", "fox"),
                      lambda image: classes("dog", "cat", "fox") if image in flipped else classes("cat", "dog", "fox"),
                      photos)
    assert not result.passed and result.share == 0.75 and result.evidence == 4
    assert photos.items[1][0] in result.disagreements() and "FAILED" in result.table()
    assert result.table().startswith("photos: the built-in set (4 scikit-image photographs;")
    assert "top-1 dog on v2, cat on v1" in result.disagreements()


def test_agreement_on_photos_without_evidence_proves_nothing():
    photos = photos_for(10)
    unsure = classes("cat", "dog", "fox", top1=CONFIDENT_PROBABILITY / 10)  # a random-weights classifier's answer
    vacuous = run_gate(CLASSIFICATION, "v1", "v2", lambda image: unsure, lambda image: unsure, photos)
    assert vacuous.agrees and not vacuous.passed and vacuous.evidence == 0
    assert "TOO LITTLE EVIDENCE" in vacuous.table()
    assert vacuous.too_little_evidence().startswith("only 0 of the 10 photos carried evidence")
    nothing = run_gate(DETECTION, "v1", "v2", lambda image: boxes(), lambda image: boxes(), photos)
    assert nothing.agrees and not nothing.passed  # two detectors that find nothing on photos of nothing


def test_the_share_is_counted_where_the_photos_carried_evidence():
    photos = Photos("--photos faces/", held_out_photos(10))
    with_faces = {image for _, image in photos.items[:MIN_EVIDENCE_PHOTOS]}

    def live(image: bytes) -> dict:
        return boxes([10, 10, 50, 50]) if image in with_faces else boxes()

    same = run_gate(DETECTION, "v1", "v2", live, live, photos)
    assert same.passed and same.evidence == MIN_EVIDENCE_PHOTOS and "passed" in same.table()
    collapsed = run_gate(DETECTION, "v1", "v2", live, lambda image: boxes(), photos)  # finds no face at all
    assert not collapsed.agrees and collapsed.share == 0.0  # 7 empty photos "agreeing" do not hide it
    assert "v2 misses 1 boxes v1 finds" in collapsed.disagreements()


def test_the_photos_are_the_operators_folder_else_the_candidates_own_else_the_built_in_set(tmp_path):
    store, folder = tmp_path / "store", tmp_path / "faces"
    store.mkdir(), folder.mkdir()
    face = png_bytes(sample_photo("astronaut")[:200, 150:350])
    (folder / "mine.png").write_bytes(face)
    carried = {f"holdout/{n}.png": face for n in ("a", "b", "c")}
    candidate = prepare(archive(tmp_path / "v2.mar", 2, photos=carried), "faces", store)
    bare = prepare(archive(tmp_path / "v3.mar", 3), "faces", store)

    own = photos_for(None, candidate)
    assert [name for name, _ in own.items] == ["a.png", "b.png", "c.png"] and own.items[0][1] == face
    assert own.source.startswith("the 3 held-out photos faces.v2.mar carries")
    assert [name for name, _ in photos_for(2, candidate).items] == ["a.png", "b.png"]  # --photos N: the first N
    given = photos_for(folder, candidate)  # --photos DIR wins
    assert given.items == [("mine.png", face)] and given.source == f"--photos {folder}"
    builtin = photos_for(None, bare)
    assert len(builtin.items) == PHOTO_COUNT and builtin.source.startswith(f"the built-in set ({PHOTO_COUNT} ")
    assert [name for name, _ in builtin.items] == [name for name, _ in held_out_photos(PHOTO_COUNT)]
