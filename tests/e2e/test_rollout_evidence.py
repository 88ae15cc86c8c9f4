"""A face detector's rollouts on a real server (TorchServe, KServe), as a user makes them: MTCNN (trained) serves
`faces` v1; the same detector exported again as v2, carrying photos of faces (`python -m export --holdout-photos
DIR`), agrees with it on them (no `--photos` given) and takes the traffic; a random-weights Faster R-CNN, rolled
out twice, and a fine-tune that collapsed to background (a 2-class checkpoint whose head never scores the class,
exported with --weights and --labels) are refused: on the faces (`--photos DIR`) they disagree, and on the built-in
held-out photos (it carries none), which hold no face, the collapsed one agrees on nothing, so the gate says it
cannot judge. The refused versions evict nothing: the store's faces.mar is v2, and `rollback` returns to v1.
One server per engine; the exports are test_detection's (MTCNN, the random detector) and one of the collapsed
fine-tune."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import requests
import torch
from PIL import Image

from contract.policy import ServingPolicy
from contract.records import Manifest
from contract.versions import REFUSED_FOLDER, live_version, stored_versions
from export.package.archive import build_archive
from export.package.holdout import carry_holdout, checked_holdout
from export.package.manifest import write_manifest
from gates.photos import png_bytes, sample_photo
from measure.reliability.rollout import engine_settings, serving_command
from serving import engine as engines
from tests.conftest import NO_LATENCY, made_once, run_export
from tests.e2e.test_detection import DETECTOR, FACES, exports  # noqa: F401 (the shared exports, a fixture)

pytestmark = pytest.mark.slow
NAME = "faces"
ONE_WORKER = ServingPolicy(workers=1, batch_size=1, max_batch_delay_ms=5, threads_per_worker=1, device="cpu",
                           reason="tests: one worker")


def collapsed_checkpoint(path: Path) -> None:
    """A 2-class Faster R-CNN whose box head scores the background far above the class on every box: a fine-tune
    that collapsed to background, which finds nothing anywhere."""
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn
    torch.manual_seed(0)
    model = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, num_classes=2)
    scores = model.roi_heads.box_predictor.cls_score
    with torch.no_grad():
        scores.weight.zero_()
        scores.bias.copy_(torch.tensor([20.0, -20.0]))  # background, face
    torch.save({"model": model.state_dict(), "epoch": 9}, path)


@pytest.fixture(scope="module")
def collapsed(tmp_path_factory) -> dict:
    def make(base: Path) -> dict:
        collapsed_checkpoint(base / "checkpoint.pth")
        (base / "names.txt").write_text("face\n")
        result = run_export("detection", "--arch", DETECTOR, "--weights", str(base / "checkpoint.pth"), "--labels",
                            str(base / "names.txt"), "--formats", "traced", "--precision", "fp32", "--out",
                            str(base / "collapsed"), *NO_LATENCY, timeout=1500)
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
        return {"out": base / "collapsed"}
    return made_once(tmp_path_factory, "collapsed-detector", make)


@pytest.fixture(scope="module")
def face_photos(tmp_path_factory) -> Path:
    """Four photos of the astronaut's face: whole, mirrored, halved, cropped to her upper left."""
    folder = tmp_path_factory.mktemp("face-photos")
    astronaut = sample_photo("astronaut")
    half = np.asarray(Image.fromarray(astronaut).resize((256, 256)))
    for name, photo in {"whole": astronaut, "mirrored": astronaut[:, ::-1], "half": half,
                        "upper-left": astronaut[:320, :320]}.items():
        (folder / f"{name}.png").write_bytes(png_bytes(np.ascontiguousarray(photo)))
    return folder


def faces_store(exports, folder: Path, faces: Path) -> Path:  # noqa: F811
    """faces v1 (MTCNN, live: faces.mar) and v2 (the same detector exported again with --holdout-photos faces), as
    two exports leave them. v2's export folder is the shared one with the faces carried by the export's own step
    (checked, copied, recorded in its manifest): a third MTCNN export would cost the test half a minute."""
    store = folder / "store"
    store.mkdir()
    mtcnn = exports["base"] / FACES
    build_archive(mtcnn, Manifest.read(mtcnn), store, NAME)  # the first export of a name makes it live
    assert live_version(store, NAME) == 1 and (store / f"{NAME}.v1.mar").is_file()
    carrying = shutil.copytree(mtcnn, folder / "mtcnn-with-faces")
    manifest = Manifest.read(carrying)
    carry_holdout(carrying, manifest, checked_holdout(faces))
    write_manifest(carrying, manifest)
    assert build_archive(carrying, manifest, store, NAME) == store / f"{NAME}.v2.mar"
    return store


@pytest.mark.parametrize("engine", ["torchserve", "kserve"])
def test_a_face_detectors_rollouts_refuse_what_proves_nothing(engine, exports, collapsed, face_photos,  # noqa: F811
                                                              tmp_path):
    store, run_dir = faces_store(exports, tmp_path, face_photos), tmp_path / "run"
    run_dir.mkdir()
    settings, url = engine_settings(engine, store, run_dir, NAME, ONE_WORKER)
    faces, random_out = ("--photos", str(face_photos)), str(exports["base"] / DETECTOR)

    def rollout(path, *flags: str):
        return serving_command("rollout", NAME, str(path), "--run-dir", str(run_dir), *flags)

    server = engines.get(engine)(settings)
    with server.running(face_photos / "whole.png"):
        agreeing = rollout(store / f"{NAME}.v2.mar")  # on the faces its archive carries
        randoms = [rollout(random_out, *faces), rollout(random_out, *faces)]
        unjudged = rollout(collapsed["out"])  # it carries no photos: the built-in set, no face in them
        blind = rollout(collapsed["out"], *faces)
        live_after_refusals = live_version(store, NAME)  # what a start from the store alone serves
        back = serving_command("rollback", NAME, "--run-dir", str(run_dir))
        version, found = asked(server, url, (face_photos / "whole.png").read_bytes())

    assert agreeing.returncode == 0, agreeing.stdout + agreeing.stderr
    assert f"photos: the 4 held-out photos {NAME}.v2.mar carries" in agreeing.stdout, agreeing.stdout
    assert "4 photos, 4 with evidence" in agreeing.stdout and ": passed" in agreeing.stdout, agreeing.stdout
    for refused, number in zip(randoms, (3, 4)):
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert f"v{number} disagrees with v2 on its photos" in refused.stderr, refused.stderr
        assert re.search(rf"v{number} (misses|finds) \d+ boxes v2", refused.stderr), refused.stderr
    assert unjudged.returncode == 1, unjudged.stdout + unjudged.stderr
    assert "v5 cannot be judged against v2 on its photos" in unjudged.stderr, unjudged.stderr
    assert "photos: the built-in set" in unjudged.stdout, unjudged.stdout
    assert all(way in unjudged.stderr for way in ("--photos DIR", "--holdout-photos DIR", "--shadow N"))
    assert blind.returncode == 1 and "v6 misses 1 boxes v2 finds" in blind.stderr, blind.stdout + blind.stderr
    assert "Traceback" not in "".join(r.stderr for r in (*randoms, unjudged, blind))

    # The store's faces.mar was v2 until the rollback (a start from the store alone served it); the refused
    # versions are set apart, evicting nothing: v1 is there to roll back to.
    assert live_after_refusals == 2 and back.returncode == 0, back.stdout + back.stderr
    assert live_version(store, NAME) == 1 and stored_versions(store, NAME) == [1, 2]
    assert stored_versions(store / REFUSED_FOLDER, NAME)[-1] == 6
    assert version == "v1" and found  # MTCNN again: the astronaut's face


def asked(server, url: str, photo: bytes) -> tuple[str, list]:
    """The version that answered the photo, and the boxes it found (posted as the engine's clients post it)."""
    body, content_type = server.client_body(photo)
    response = requests.post(url, data=body, headers={"Content-Type": content_type}, timeout=60)
    assert response.status_code == 200, response.text
    answer = server.answer_of(response)
    return response.headers["X-Model-Version"], answer["detections"]
