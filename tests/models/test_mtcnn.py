"""MTCNN as one module (models.mtcnn): facenet-pytorch's trained networks on real photographs give facenet-pytorch's
own boxes, on the faces; the scripted cascade answers as eager; no face, or an image under the smallest face,
gives empty tensors; PNet alone exports to ONNX at any size."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch
from torchvision.ops import box_iou

import models
from contract.records import DETECTION
from gates.boxes import Detections, SetTolerance, compare_detections
from models import mtcnn, mtcnn_entry
from models.weights import WeightsError

pytest.importorskip("facenet_pytorch", reason="pip install --no-deps facenet-pytorch (MTCNN's trained networks)")
skimage_data = pytest.importorskip("skimage.data")

# Against facenet-pytorch: the same algorithm on the same pixels, so the same boxes up to float rounding.
AS_FACENET = SetTolerance(box_iou=0.9, score_atol=1e-3, edge=0.0, mask_iou=0.0)
FACES = {"astronaut": 1, "camera": 1, "grid": 25, "pasted": 2}  # facenet-pytorch's own counts
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def scripted(mtcnn_detector):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script's deprecation notice
        return torch.jit.script(mtcnn_detector)


@pytest.fixture(scope="module")
def photos():
    """uint8 RGB arrays: the faces facenet-pytorch finds, and photographs without one."""
    grey = skimage_data.camera()
    return {"astronaut": skimage_data.astronaut(), "camera": np.stack([grey] * 3, axis=-1),
            "grid": np.stack([mtcnn_entry.face_grid()] * 3, axis=-1), "pasted": mtcnn_entry.pasted_faces(),
            "coffee": skimage_data.coffee(), "chelsea": skimage_data.chelsea()}


@pytest.fixture(scope="module")
def answers(mtcnn_detector, photos):
    """Eager's answer per photo, computed once."""
    with torch.no_grad():
        return {name: Detections.of(mtcnn_detector(mtcnn_entry.photo_tensor(array))) for name, array in photos.items()}


def facenet_detect(array: np.ndarray) -> Detections:
    """facenet-pytorch's own MTCNN.detect (numpy and Python loops) on the PIL image of `array`."""
    from facenet_pytorch import MTCNN
    from PIL import Image
    boxes, probabilities = MTCNN(keep_all=True).detect(Image.fromarray(array))
    if boxes is None:
        return Detections(torch.zeros(0, 4), torch.zeros(0, dtype=torch.int64), torch.zeros(0))
    scores = torch.tensor(np.asarray(probabilities, dtype=np.float32))
    return Detections(torch.tensor(boxes.astype(np.float32)), torch.full_like(scores, mtcnn.FACE, dtype=torch.int64),
                      scores)


@pytest.mark.parametrize("name", [*FACES, "coffee"])
def test_the_boxes_are_facenet_pytorchs_own(name, photos, answers):
    reference = facenet_detect(photos[name])
    found = compare_detections(reference, answers[name], AS_FACENET, mtcnn_entry.LIMITS)
    assert found.passed and len(answers[name]) == len(reference) == FACES.get(name, 0), found.line()
    if len(reference):
        assert found.worst_box_iou >= 0.999 and found.worst_score_diff <= 1e-5, found.as_dict()


def test_the_boxes_land_on_the_faces(photos, answers):
    """Where the faces are is known independently: scikit-image's LBP face cascade on the astronaut and the
    cameraman; the paste positions and the grid's tiles by construction."""
    for name in ("astronaut", "camera"):
        cascade = lbp_faces(photos[name])
        assert box_iou(answers[name].boxes, cascade).max(dim=1).values.min() >= 0.5, (name, cascade)
    pasted = torch.tensor([[x, y, x + w, y + h] for (w, h), (x, y) in mtcnn_entry.PASTES], dtype=torch.float32)
    assert sorted(inside(answers["pasted"].boxes, pasted)) == [0, 1]
    tile = 25 * 4
    tiles = [[c * tile, r * tile, (c + 1) * tile, (r + 1) * tile] for r in range(5) for c in range(5)]
    assert len(set(inside(answers["grid"].boxes, torch.tensor(tiles, dtype=torch.float32)))) == FACES["grid"]
    assert (answers["grid"].labels == mtcnn.FACE).all() and mtcnn.LABELS[mtcnn.FACE] == "face"


def lbp_faces(array: np.ndarray) -> torch.Tensor:
    from skimage.color import rgb2gray
    from skimage.feature import Cascade
    cascade = Cascade(skimage_data.lbp_frontal_face_cascade_filename())
    found = cascade.detect_multi_scale(img=rgb2gray(array), scale_factor=1.2, step_ratio=1, min_size=(40, 40),
                                       max_size=(200, 200))
    return torch.tensor([[f["c"], f["r"], f["c"] + f["width"], f["r"] + f["height"]] for f in found],
                        dtype=torch.float32)


def inside(boxes: torch.Tensor, regions: torch.Tensor) -> list[int]:
    """For each box, the region that holds its centre (every box must be in one)."""
    centres = (boxes[:, :2] + boxes[:, 2:]) / 2
    holds = ((centres[:, None, :] >= regions[None, :, :2]) & (centres[:, None, :] <= regions[None, :, 2:])).all(-1)
    assert holds.any(dim=1).all(), (boxes, regions)
    return holds.float().argmax(dim=1).tolist()


def test_the_scripted_cascade_answers_as_eager(scripted, photos, answers):
    with torch.no_grad():
        for name, array in photos.items():
            boxes, labels, scores = scripted(mtcnn_entry.photo_tensor(array))
            expected = answers[name]
            assert torch.allclose(boxes, expected.boxes, atol=1e-4), name
            assert torch.equal(labels, expected.labels) and torch.allclose(scores, expected.scores, atol=1e-6), name


@pytest.mark.parametrize("size", [(1, 1), (10, 10), (11, 300), (19, 19)])
def test_an_image_under_the_smallest_face_gives_no_boxes(size, mtcnn_detector, scripted):
    image = torch.rand(1, 3, *size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for form in (mtcnn_detector, scripted):
            assert_empty(form(image))


def test_a_photo_without_a_face_gives_empty_tensors_of_the_right_kind(scripted, photos, answers):
    assert len(answers["coffee"]) == len(answers["chelsea"]) == 0
    with torch.no_grad():
        assert_empty(scripted(mtcnn_entry.photo_tensor(photos["coffee"])))


def assert_empty(outputs) -> None:
    boxes, labels, scores = outputs
    assert (boxes.shape, labels.shape, scores.shape) == ((0, 4), (0,), (0,))
    assert (boxes.dtype, labels.dtype, scores.dtype) == (torch.float32, torch.int64, torch.float32)


def test_a_trace_freezes_the_cascade_to_its_image(mtcnn_detector, photos, answers):
    """The trace unrolls the pyramid and the last NMS for the astronaut: another photo fails in the graph, or,
    with more candidates than the astronaut's, answers wrong without a word. So the cascade is scripted."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(mtcnn_detector, mtcnn_entry.photo_tensor(photos["astronaut"]), check_trace=False)
    with torch.no_grad():
        assert torch.equal(traced(mtcnn_entry.photo_tensor(photos["astronaut"]))[0], answers["astronaut"].boxes)
        with pytest.raises(RuntimeError, match="out of range"):
            traced(mtcnn_entry.photo_tensor(photos["camera"]))
        assert len(traced(mtcnn_entry.photo_tensor(photos["grid"]))[2]) != len(answers["grid"])


def test_pnet_exports_to_onnx_at_any_height_and_width():
    ort = pytest.importorskip("onnxruntime")
    pnet = mtcnn.load_networks()[0]
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(pnet, (torch.rand(1, 3, 64, 48),), buffer, dynamo=False, opset_version=17,
                          input_names=["image"], output_names=["offsets", "faceness"],
                          dynamic_axes={"image": {0: "batch", 2: "height", 3: "width"}})
    session = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    for shape in [(1, 3, 12, 12), (2, 3, 155, 110), (1, 3, 401, 599)]:
        image = torch.rand(shape, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            expected = pnet(image)
        for got, want in zip(session.run(None, {"image": image.numpy()}), expected):
            assert got.shape == tuple(want.shape) and np.abs(got - want.numpy()).max() < 1e-5, shape


def test_the_entry_is_registered_in_the_detection_family():
    entry = models.get(mtcnn_entry.ENTRY_NAME)
    assert entry.task == DETECTION and entry.outputs == ("boxes", "labels", "scores")
    assert mtcnn_entry.ENTRY_NAME in models.family(DETECTION).archs
    assert entry.limits.score_threshold == mtcnn.THRESHOLDS[2] and not entry.input_spec.dynamic_batch
    assert entry.example_input().shape == entry.input_spec.shape == mtcnn_entry.EXAMPLE_SHAPE
    assert mtcnn_entry.mtcnn_entry(family="faces").family == "faces"
    rule = entry.input_spec.resize_rule
    assert rule.size(3024, 4032) == (960, 1280) and rule.size(512, 512) == (512, 512)  # shrunk, never enlarged


def test_weights_are_facenet_pytorchs_or_a_folder_of_the_three(tmp_path):
    built = mtcnn_entry.build("auto")
    assert built.labels == ["__background__", "face"] and built.weights.kind == "trained"
    assert mtcnn.WEIGHTS_WHEEL in built.weights.source
    assert mtcnn_entry.build(str(mtcnn.weights_folder())).weights.kind == "path"
    with pytest.raises(WeightsError, match="finds no faces"):
        mtcnn_entry.build("random")
    with pytest.raises(WeightsError, match="pnet.pt is missing"):
        mtcnn_entry.build(str(tmp_path))
    torch.save({"conv1.weight": torch.zeros(1)}, tmp_path / "pnet.pt")
    with pytest.raises(WeightsError, match="is not MTCNN.s PNet state_dict"):
        mtcnn.load_networks(tmp_path)
