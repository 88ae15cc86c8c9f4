"""A user's own detector and segmenter end to end, made here with the tests' own classes (tests/own_models.py):
a fine-tuned Faster R-CNN as a training checkpoint through `export detection --weights CKPT --labels`, an LR-ASPP
state_dict through `export segmentation`, and a Mask R-CNN of its own backbone through `export module FILE:factory`
(task read from its output); all three archives served by one TorchServe, one KServe ModelServer and one Ray Serve,
each answer equal to the served form's in this process, named with the user's classes and resized by the model's
own transform."""

from __future__ import annotations

import argparse
import base64
import json
import zipfile
from pathlib import Path

import pytest
import requests
import torch

from contract.policy import PolicyChoices, ServingPolicy
from contract.records import DETECTION, SEGMENTATION, Manifest
from serving.kserve.config import KServeSettings
from serving.kserve.engine import KServe
from serving.settings import free_port
from serving.torchserve import server
from tests import own_models
from tests.answers import ServedForms
from tests.conftest import NO_LATENCY, ROOT, made_once, run_export

pytestmark = pytest.mark.slow
CAT = ROOT / "examples" / "cat.jpg"
DETECTOR, SEGMENTER, MASKS = "own-detector", "own-segmenter", "own-masks"
FORMATS = "traced"  # one form each: the tests of every form are the COCO models' (tests/e2e/test_detection.py)
FACTORY = '''import torch


def build():
    return torch.load({path!r}, weights_only=False)  # the user's own pickled model, from their own file
'''


def _exported(base: Path, store: Path, name: str, *command: str) -> None:
    result = run_export(*command, "--formats", FORMATS, "--precision", "fp32", "--out", str(base / name),
                        "--model-store", str(store), "--name", name, *NO_LATENCY, timeout=1500)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict:
    def make(base: Path) -> dict:
        store = base / "model-store"
        torch.set_num_threads(1)
        torch.save({"model": own_models.fine_tuned_detector().state_dict(), "epoch": 2,
                    "args": argparse.Namespace(lr=0.02)}, base / "checkpoint.pth")
        (base / "names.txt").write_text("\n".join(own_models.DETECTOR_CLASSES) + "\n")
        _exported(base, store, DETECTOR, "detection", "--arch", "fasterrcnn_mobilenet_v3_large_320_fpn",
                  "--weights", str(base / "checkpoint.pth"), "--labels", str(base / "names.txt"))
        torch.save(own_models.fine_tuned_segmenter().state_dict(), base / "segmenter.pt")
        (base / "classes.json").write_text(json.dumps(own_models.SEGMENTER_CLASSES))
        _exported(base, store, SEGMENTER, "segmentation", "--arch", "lraspp_mobilenet_v3_large",
                  "--weights", str(base / "segmenter.pt"), "--labels", str(base / "classes.json"))
        torch.save(own_models.small_mask_detector(), base / "masks.pt")
        (base / "factory.py").write_text(FACTORY.format(path=str(base / "masks.pt")))
        (base / "pebbles.txt").write_text("\n".join(own_models.MASK_CLASSES))
        _exported(base, store, MASKS, "module", f"{base / 'factory.py'}:build", "--input-shape", "1,3,480,640",
                  "--labels", str(base / "pebbles.txt"))
        return {"base": base, "store": store}
    return made_once(tmp_path_factory, "own-model-exports", make)


@pytest.fixture(scope="module")
def in_process(exports) -> ServedForms:
    """Each archive, unpacked, in this process: an answer is held to the form it names (tests/answers.py)."""
    folders = {}
    for name in (DETECTOR, SEGMENTER, MASKS):
        folders[name] = exports["base"] / "unpacked" / name
        with zipfile.ZipFile(exports["store"] / f"{name}.mar") as archive:
            archive.extractall(folders[name])
    return ServedForms(folders)


def test_the_exports_record_the_users_classes_and_the_models_own_resize(exports):
    detector = Manifest.read(exports["base"] / DETECTOR)
    assert detector.task == DETECTION and detector.model.source["num_classes"] == 4
    labels = (exports["base"] / DETECTOR / detector.labels_file()).read_text()
    assert all(name in labels for name in own_models.DETECTOR_CLASSES) and "person" not in labels
    assert detector.input.resize_rule.min_side == 320  # a state_dict keeps no transform: the arch's
    masks = Manifest.read(exports["base"] / MASKS)
    assert masks.task == DETECTION and [o.name for o in masks.outputs][-1] == "masks"
    assert masks.input.resize_rule.min_side == own_models.DETECTOR_SIZES["min_size"]  # the module's own transform
    assert masks.model.source["task"] == DETECTION
    segmenter = Manifest.read(exports["base"] / SEGMENTER)
    assert segmenter.task == SEGMENTATION and segmenter.output.shape[1] == 4


def _answers_named_by_the_user(name: str, answer: dict) -> None:
    if name == SEGMENTER:
        assert {c["label"] for c in answer["classes"]} <= {"__background__", *own_models.SEGMENTER_CLASSES}
        return
    names = own_models.MASK_CLASSES if name == MASKS else own_models.DETECTOR_CLASSES
    assert answer["detections"] and {d["label"] for d in answer["detections"]} <= set(names)
    assert all("mask" in d for d in answer["detections"]) == (name == MASKS)


@pytest.fixture(scope="module")
def torchserve(exports, tmp_path_factory):
    settings = server.on_free_ports(exports["store"], tmp_path_factory.mktemp("own-torchserve"))
    settings.models = (DETECTOR, SEGMENTER, MASKS)
    with server.running(settings, CAT):
        yield settings


@pytest.fixture(scope="module")
def kserve(exports, tmp_path_factory):
    settings = KServeSettings(exports["store"], (DETECTOR, SEGMENTER, MASKS), http_port=free_port(),
                              run_dir=tmp_path_factory.mktemp("own-kserve"),
                              flags=PolicyChoices(workers=1, threads_per_worker=1))  # as in-process: the same sums
    with KServe(settings).running(CAT):
        yield settings


@pytest.fixture(scope="module")
def ray_served(exports, tmp_path_factory):
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install '.[ray]' (an optional extra)")
    from serving.ray.config import RaySettings
    from serving.ray.engine import RayServe
    one_replica = ServingPolicy(workers=1, batch_size=1, max_batch_delay_ms=5, threads_per_worker=1, device="cpu",
                                reason="tests: one replica per model, one core each")
    settings = RaySettings(exports["store"], (DETECTOR, SEGMENTER, MASKS), http_port=free_port(),
                           run_dir=tmp_path_factory.mktemp("own-ray"), policy=one_replica, signals_port=free_port())
    with RayServe(settings).running(CAT):
        yield settings


def _posted(url: str) -> dict:
    served = requests.post(url, data=CAT.read_bytes(), headers={"Content-Type": "image/jpeg"}, timeout=300)
    assert served.status_code == 200, served.text
    return served.json()


def _kserve_v1(settings: KServeSettings, name: str) -> dict:
    body = {"instances": [{"image": {"b64": base64.b64encode(CAT.read_bytes()).decode()}}]}
    served = requests.post(settings.predict_url(name), json=body, timeout=300)
    assert served.status_code == 200, served.text
    return served.json()["predictions"][0]


@pytest.mark.parametrize("engine", ["torchserve", "kserve", "ray_served"])
def test_every_engine_answers_with_the_users_classes_what_the_served_form_answers_in_process(engine, request,
                                                                                             in_process):
    settings = request.getfixturevalue(engine)
    for name in (DETECTOR, SEGMENTER, MASKS):
        if engine == "torchserve":
            answer = _posted(f"{settings.inference_url}/predictions/{name}")
        elif engine == "kserve":
            answer = _kserve_v1(settings, name)
        else:
            answer = _posted(settings.predictions_url(name))
        assert answer == json.loads(json.dumps(in_process.answer(name, answer, CAT.read_bytes())))
        _answers_named_by_the_user(name, answer)


def test_the_fine_tuned_detector_is_re_checked_from_its_manifest(exports):
    """`export parity`: the arch rebuilt at the recorded classes from the checkpoint, its forms held to it as sets."""
    result = run_export("parity", str(exports["base"] / DETECTOR), timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "rebuilt weights are the exported ones" in result.stderr + result.stdout


def test_the_module_is_rebuilt_from_its_manifest_at_its_task_with_the_exported_weights(exports):
    """What `export parity` and `explain` rebuild of a module: its factory's model at the recorded task."""
    from export.package.rebuild import entry_from_manifest, weights_from_manifest
    from models.weights import state_dict_fingerprint
    manifest = Manifest.read(exports["base"] / MASKS)
    entry = entry_from_manifest(manifest)
    built = entry.build(weights_from_manifest(manifest))
    assert entry.task == DETECTION and entry.outputs == tuple(o.name for o in manifest.outputs)
    assert state_dict_fingerprint(built.module) == manifest.weights["state_dict_sha256"]
