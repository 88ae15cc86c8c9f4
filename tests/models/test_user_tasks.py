"""`export module`: the task read from what a user's module returns (models.user_tasks), and the output adapters that
give a module in torchvision's conventions the detection or segmentation wrapper (models.outputs)."""

from __future__ import annotations

import textwrap

import pytest
import torch

from contract.records import CLASSIFICATION, DETECTION, SEGMENTATION
from models.detection import DetectorOutputs, SegmenterOutputs
from models.fine_tuned import BACKGROUND
from models.outputs import ListMaskDetectorOutputs, OutSegmenterOutputs
from models.user_module import UserModuleError
from models.user_tasks import module_entry, task_of

SHAPE = (1, 3, 48, 64)
FACTORIES = textwrap.dedent('''
    from typing import Dict, List

    import torch
    import torchvision
    from torch import nn


    def torchvision_detector():
        return torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
            weights=None, weights_backbone=None, num_classes=3, min_size=96, max_size=128, box_score_thresh=0.2)


    class Blobs(nn.Module):
        """Not torchvision's: a list of dicts with boxes, labels, scores and masks, eager and scripted alike."""

        def __init__(self):
            super().__init__()
            self.score = nn.Conv2d(3, 1, 3, padding=1)

        def forward(self, images: List[torch.Tensor]) -> List[Dict[str, torch.Tensor]]:
            found: List[Dict[str, torch.Tensor]] = []
            for image in images:
                heat = torch.sigmoid(self.score(image[None]))[0, 0]
                height, width = heat.shape
                boxes = torch.stack([torch.zeros(2), torch.zeros(2), torch.tensor([width / 2.0, float(width)]),
                                     torch.tensor([height / 2.0, float(height)])], dim=1)
                found.append({"boxes": boxes, "labels": torch.tensor([1, 2]), "scores": heat.mean().expand(2),
                              "masks": heat.expand(2, 1, height, width)})
            return found


    def blobs():
        return Blobs()


    class Painter(nn.Module):
        def __init__(self, as_dict: bool):
            super().__init__()
            self.as_dict = as_dict
            self.conv = nn.Conv2d(3, 4, 1)

        def forward(self, image):
            return {"out": self.conv(image), "aux": self.conv(image)} if self.as_dict else self.conv(image)


    def painter_dict():
        return Painter(True)


    def painter_tensor():
        return Painter(False)


    def pair():
        return nn.Sequential(nn.Conv2d(3, 2, 1), nn.Flatten()), None


    class TwoOutputs(nn.Module):
        def forward(self, image):
            return image.mean(), image.amax()


    def two_outputs():
        return TwoOutputs()


    def fails():
        return nn.Linear(3, 2)
''')


@pytest.fixture(scope="module")
def factories(tmp_path_factory):
    path = tmp_path_factory.mktemp("factories") / "own_factories.py"
    path.write_text(FACTORIES)
    return path


def labels_file(tmp_path, *names):
    path = tmp_path / "labels.txt"
    path.write_text("\n".join(names))
    return path


def test_outputs_in_torchvisions_conventions_name_their_task():
    detections = [{"boxes": torch.zeros(0, 4), "labels": torch.zeros(0), "scores": torch.zeros(0)}]
    assert task_of(detections, SHAPE).task == DETECTION and not task_of(detections, SHAPE).masks
    assert task_of([{**detections[0], "masks": torch.zeros(0, 1, 48, 64)}], SHAPE).masks
    assert task_of({"out": torch.zeros(1, 5, 48, 64)}, SHAPE).classes == 5
    maps = torch.zeros(1, 5, 48, 64)
    assert task_of(maps, SHAPE).task == CLASSIFICATION and "--task segmentation" in task_of(maps, SHAPE).why
    assert task_of(maps, SHAPE, SEGMENTATION).task == SEGMENTATION
    assert task_of(torch.zeros(1, 10), SHAPE).task == CLASSIFICATION
    assert task_of((maps, maps), SHAPE).task is None and task_of({"logits": maps}, SHAPE).task is None
    with pytest.raises(UserModuleError, match="--task detection: the module's output does not fit it"):
        task_of(torch.zeros(1, 10), SHAPE, DETECTION)


def test_a_torchvision_detector_gets_its_own_resize_limits_and_the_background_label(factories, tmp_path):
    entry, found = module_entry(f"{factories}:torchvision_detector", (1, 3, 480, 640),
                                labels_file(tmp_path, "kite", "drone"))
    assert found.task == DETECTION and entry.task == DETECTION and entry.source["task"] == DETECTION
    assert (entry.input_spec.resize_rule.min_side, entry.input_spec.resize_rule.max_side) == (96, 128)
    assert entry.limits.score_threshold == 0.2 and entry.outputs == ("boxes", "labels", "scores")
    built = entry.build("auto")
    assert type(built.module) is DetectorOutputs and built.labels == [BACKGROUND, "kite", "drone"]
    boxes, labels, scores = built.module(entry.example_input())
    assert boxes.shape[1:] == (4,) and labels.shape == scores.shape


def test_a_module_of_its_own_in_the_conventions_is_scripted_through_the_list_adapter(factories):
    entry, found = module_entry(f"{factories}:blobs", SHAPE)
    assert found.masks and entry.outputs[-1] == "masks" and entry.limits.max_detections > 0
    assert entry.input_spec.resize_rule.source.startswith("--input-shape")
    module = entry.build("auto").module.eval()
    assert isinstance(module, ListMaskDetectorOutputs)
    image = entry.example_input()
    for eager, scripted in zip(module(image), torch.jit.script(module)(image)):
        assert torch.equal(eager, scripted)


def test_segmenters_a_dict_with_out_or_logits_with_the_task_given(factories, tmp_path):
    entry, found = module_entry(f"{factories}:painter_dict", SHAPE, labels_file(tmp_path, "a", "b", "c"))
    built = entry.build("auto")
    assert isinstance(built.module, OutSegmenterOutputs) and not isinstance(built.module, SegmenterOutputs)
    assert found.classes == 4 and built.labels == [BACKGROUND, "a", "b", "c"]
    assert built.module(torch.rand(SHAPE)).shape == (1, 4, 48, 64)
    entry, _ = module_entry(f"{factories}:painter_tensor", SHAPE, task=SEGMENTATION)
    assert entry.task == SEGMENTATION and entry.build("auto").module(torch.rand(SHAPE)).shape == (1, 4, 48, 64)


def test_a_module_fitting_no_task_is_entered_as_before_and_says_why(factories):
    entry, found = module_entry(f"{factories}:two_outputs", SHAPE)
    assert found.task is None and "returns tuple" in found.why
    assert entry.task == CLASSIFICATION and entry.source["task"] == "auto"
    with pytest.raises(UserModuleError, match="returned tuple, not a torch.nn.Module"):
        module_entry(f"{factories}:pair", SHAPE)


def test_a_module_that_fails_on_its_input_is_left_to_the_exports_own_checks_unless_a_task_is_asked(factories):
    entry, found = module_entry(f"{factories}:fails", SHAPE)
    assert found.task == CLASSIFICATION and "failed on an input of shape (1, 3, 48, 64)" in found.why
    with pytest.raises(UserModuleError, match="RuntimeError"):
        module_entry(f"{factories}:fails", SHAPE, task=DETECTION)
