"""A trained detector's reduced precision: MTCNN's networks in bf16 (scripted-bf16-backbone), gated box by box on
held-out photographs that are none of its parity probes. The gate is run on real cascades on real photos: the
bf16 candidate, and cascades that lose faces or find none; the export is run once, as a user runs it, and checked
for what this CPU (or the simulated one, tests/simulate_cpu.py) can compute in bf16."""

from __future__ import annotations

import json

import pytest
import torch

from contract.records import Manifest
from export.forms import kinds
from export.precision.backbone import bf16_backbone
from export.precision.detections import judge_boxes
from export.precision.gate import BF16_BOX_TOLERANCE, GATE_PASSED
from export.precision.request import cpu_has_native_bf16
from gates.boxes import Detections
from tests.conftest import export_in_process

pytest.importorskip("facenet_pytorch", reason="pip install --no-deps facenet-pytorch (MTCNN's trained networks)")
pytest.importorskip("skimage.data")

from models import mtcnn, mtcnn_entry  # noqa: E402 (after the skips: the entry reads scikit-image's photos)

KIND = "scripted-bf16-backbone"
GRID = "lfw_subset faces 26-50, 5 x 5 grid, x3 (75 px faces)"  # a held-out photo with the smallest faces


@pytest.fixture(scope="module")
def photos():
    return mtcnn_entry.held_out_photos()


@pytest.fixture(scope="module")
def fp32(mtcnn_detector, photos, one_thread):
    return answers(mtcnn_detector, photos)


def answers(model, photos) -> dict[str, Detections]:
    with torch.inference_mode():
        return {name: Detections.of(model(photo)) for name, photo in photos.items()}


def test_only_the_networks_layers_compute_in_bf16(mtcnn_detector):
    candidate, layers = bf16_backbone(mtcnn_detector)
    in_bf16 = {name for name, p in candidate.named_parameters() if p.dtype == torch.bfloat16}
    convolutions = sum(isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)) for m in mtcnn_detector.modules())
    assert layers == convolutions and len(in_bf16) == 2 * layers  # each layer's weight and bias
    assert all(name.endswith((".layer.weight", ".layer.bias")) for name in in_bf16)
    assert all(p.dtype == torch.float32 for p in mtcnn_detector.parameters())  # the fp32 module is left as it was
    with torch.inference_mode():
        boxes, labels, scores = torch.jit.script(candidate)(mtcnn_entry.example_photo())
    assert boxes.dtype == scores.dtype == torch.float32 and len(scores) == 1


def test_the_held_out_photos_are_none_of_the_probes_and_hold_faces_and_none(photos, fp32):
    probes = mtcnn_entry.face_photos().values()
    assert not any(photo.shape == probe.shape and torch.equal(photo, probe) for photo in photos.values() for probe in probes)
    assert [len(answer) for answer in fp32.values()] == [25, 25, 25, 0, 0]


def test_the_bf16_cascade_finds_the_same_faces(mtcnn_detector, photos, fp32):
    candidate, _ = bf16_backbone(mtcnn_detector)
    gate = judge_boxes(KIND, "bf16", fp32, answers(candidate, photos), mtcnn_entry.LIMITS)
    assert gate.verdict == GATE_PASSED, gate.failures
    assert gate.metrics["recall"] == gate.metrics["precision"] == 1.0
    assert BF16_BOX_TOLERANCE.min_mean_box_iou <= gate.metrics["mean_box_iou"] < 1.0  # moved, by rounding only
    assert 0 < gate.metrics["worst_score_diff"] <= BF16_BOX_TOLERANCE.max_score_diff


def test_a_cascade_that_loses_faces_fails_and_names_the_photo(mtcnn_detector, photos, fp32):
    blind_to_small_faces = mtcnn.MTCNNDetector(mtcnn_detector.pnet, mtcnn_detector.rnet, mtcnn_detector.onet, min_face_size=90.0)
    gate = judge_boxes(KIND, "bf16", fp32, answers(blind_to_small_faces, photos), mtcnn_entry.LIMITS)
    assert not gate.passed and gate.metrics["recall"] < BF16_BOX_TOLERANCE.min_recall
    lost = next(row for row in gate.metrics["photos"] if row["photo"] == GRID)["lost"]
    assert lost > 0 and f"{GRID}: {lost} of 25 boxes lost" in gate.verdict


def test_boxes_moved_off_their_faces_fail_on_the_mean_iou(fp32):
    def shifted(answer: Detections) -> Detections:
        sides = answer.boxes[:, 2:] - answer.boxes[:, :2]
        return Detections(answer.boxes + 0.05 * sides.repeat(1, 2), answer.labels, answer.scores)  # IoU 0.82
    gate = judge_boxes(KIND, "bf16", fp32, {name: shifted(answer) for name, answer in fp32.items()}, mtcnn_entry.LIMITS)
    assert gate.metrics["recall"] == 1.0 and gate.metrics["mean_box_iou"] < BF16_BOX_TOLERANCE.min_mean_box_iou
    assert "on average" in gate.verdict


def test_photos_without_a_box_cannot_judge(fp32):
    empty = {name: answer for name, answer in fp32.items() if not len(answer)}
    gate = judge_boxes(KIND, "bf16", empty, empty, mtcnn_entry.LIMITS)
    assert not gate.passed and gate.verdict == "failed: cannot judge: fp32 finds no box on any of the 2 held-out photos"


def test_the_row_is_a_detectors_bf16_variant_ranked_just_before_its_source():
    row, order = kinds.get(KIND), kinds.serving_preference()
    assert (row.task, row.precision, row.run_precision, row.sources) == ("detection", "bf16", "fp32", ("scripted",))
    assert order.index(KIND) + 1 == order.index("scripted") and row.fast_on.cpu_any


def test_export_builds_gates_and_ships_it_where_the_cpu_computes_in_bf16(tmp_path, one_thread):
    """`python -m export detection --arch mtcnn` (--precision auto), the scripted form only (the others are
    tests/e2e/test_detection.py's): where this CPU computes in bf16 the candidate is shipped first among the gated
    candidates with its gate's numbers; elsewhere it is not made, and the export says why."""
    out = tmp_path / "mtcnn"
    done = export_in_process("detection", "--arch", "mtcnn", "--formats", "scripted", "--out", str(out),
                             "--model-store", str(tmp_path / "store"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    decision = Manifest.read(out).decision()
    if not cpu_has_native_bf16():
        assert f"{KIND} not made: bf16 on this CPU would be emulated" in done.stdout
        assert KIND not in Manifest.read(out).artifacts and [c["kind"] for c in decision.gated] == ["scripted"]
        return
    record = Manifest.read(out).artifacts[KIND]
    assert (record.precision, record.run_precision, record.format, record.source) == ("bf16", "fp32", "torchscript",
                                                                                      "scripted")
    assert record.details["accuracy"]["verdict"] == GATE_PASSED and record.details["images_per_s_batch1"] > 0
    assert [c["kind"] for c in decision.gated] == [KIND, "scripted"]
    gate = json.loads((out / "accuracy.json").read_text())["results"][0]["metrics"]
    assert (gate["fp32_boxes"], gate["matched"], gate["recall"]) == (75, 75, 1.0)
    assert "recall 100.0%, precision 100.0%" in (out / "accuracy.md").read_text()
