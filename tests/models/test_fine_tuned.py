"""A torchvision detector or segmenter fine-tuned on a user's classes, from its checkpoint (models.fine_tuned): the
classes read from its head, the three shapes a checkpoint comes in, the labels with torchvision's background, a
checkpoint that does not fit explained with the --arch that would."""

from __future__ import annotations

import argparse
import collections
import json

import pytest
import torch
import torchvision

from contract.records import DETECTION, SEGMENTATION
from models.checkpoints import WeightsError, read_checkpoint
from models.detection import categories
from models.fine_tuned import BACKGROUND, classes_in_head, fine_tuned_entry, own_checkpoint_entry
from models.weights import state_dict_fingerprint
from tests.own_models import MASK_CLASSES, maskrcnn_resnet50_checkpoint

ARCH = "fasterrcnn_mobilenet_v3_large_320_fpn"
NAMES = ("kettle", "ladle", "whisk")  # + background: 4 classes


def detector(classes: int = len(NAMES) + 1, **sizes) -> torch.nn.Module:
    torch.manual_seed(3)
    return torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=classes, **sizes).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One detector saved in the three shapes, with a names file."""
    folder = tmp_path_factory.mktemp("fine-tuned")
    model = detector(min_size=200, max_size=300, box_score_thresh=0.3, box_detections_per_img=20)
    torch.save(model.state_dict(), folder / "weights.pt")
    torch.save({"model": {f"module.{k}": v for k, v in model.state_dict().items()}, "epoch": 3,
                "args": argparse.Namespace(lr=0.02), "lr_scheduler": {"milestones": collections.Counter([8, 11])}},
               folder / "checkpoint.pth")
    torch.save(model, folder / "whole.pt")
    (folder / "names.txt").write_text("\n".join(NAMES) + "\n")
    return folder, state_dict_fingerprint(model)


@pytest.mark.parametrize("arch, classes", [(ARCH, 4), ("ssdlite320_mobilenet_v3_large", 7),
                                           ("retinanet_resnet50_fpn", 3), ("lraspp_mobilenet_v3_large", 5),
                                           ("deeplabv3_resnet50", 2)])
def test_the_number_of_classes_is_read_from_the_head_of_any_arch(arch, classes):
    build = torchvision.models.get_model_builder(arch)
    with torch.device("meta"):
        state = build(weights=None, weights_backbone=None, num_classes=classes).state_dict()
    assert classes_in_head(state, arch) == classes


@pytest.mark.parametrize("name", ["weights.pt", "checkpoint.pth", "whole.pt"])
def test_each_shape_of_checkpoint_gives_the_same_weights_with_the_users_names(saved, name):
    folder, fingerprint = saved
    entry = fine_tuned_entry(DETECTION, ARCH, str(folder / name), folder / "names.txt")
    built = entry.build(str(folder / name))
    assert state_dict_fingerprint(built.module.model) == fingerprint
    assert built.labels == [BACKGROUND, *NAMES] and "put at index 0" in entry.description
    assert entry.task == DETECTION and entry.source == {"fine_tuned": ARCH, "task": DETECTION, "num_classes": 4}
    assert read_checkpoint(str(folder / name)).shape in entry.description


def test_a_whole_model_keeps_its_own_sizes_and_thresholds_a_state_dict_gets_the_archs(saved):
    folder, _ = saved
    whole = fine_tuned_entry(DETECTION, ARCH, str(folder / "whole.pt"))
    assert (whole.input_spec.resize_rule.min_side, whole.input_spec.resize_rule.max_side) == (200, 300)
    assert (whole.limits.score_threshold, whole.limits.max_detections) == (0.3, 20)
    assert whole.input_spec.resize_rule.source == "the pickled model's own transform"
    plain = fine_tuned_entry(DETECTION, ARCH, str(folder / "weights.pt"))
    assert (plain.input_spec.resize_rule.min_side, plain.limits.max_detections) == (320, 100)
    assert plain.build(str(folder / "weights.pt")).labels is None and "by its index" in plain.description


def test_labels_files_with_the_background_or_as_json_keep_their_order(saved, tmp_path):
    folder, _ = saved
    with_background = tmp_path / "labels.json"
    with_background.write_text(json.dumps({str(i): n for i, n in enumerate([BACKGROUND, *NAMES])}))
    entry = fine_tuned_entry(DETECTION, ARCH, str(folder / "weights.pt"), with_background)
    assert entry.build(str(folder / "weights.pt")).labels == [BACKGROUND, *NAMES]
    too_few = tmp_path / "two.txt"
    too_few.write_text("kettle\nladle\n")
    with pytest.raises(WeightsError, match="has 2 names but the model has 4 classes .*give 3 names"):
        fine_tuned_entry(DETECTION, ARCH, str(folder / "weights.pt"), too_few)


def test_a_checkpoint_that_does_not_fit_names_the_arch_and_classes_that_would(saved):
    folder, _ = saved
    with pytest.raises(WeightsError, match=f"layers are those of --arch {ARCH}"):
        fine_tuned_entry(DETECTION, "fasterrcnn_resnet50_fpn", str(folder / "weights.pt"))
    with pytest.raises(WeightsError, match="built with 6 classes, the checkpoint's head has 4"):
        fine_tuned_entry(DETECTION, ARCH, str(folder / "weights.pt"), num_classes=6)
    with pytest.raises(WeightsError, match="--labels and --num-classes name the classes of your own checkpoint"):
        own_checkpoint_entry(DETECTION, ARCH, "auto", labels_file=folder / "names.txt")
    assert own_checkpoint_entry(DETECTION, ARCH, "random") is None  # the registry's entry builds it


def test_a_whole_model_of_other_classes_is_refused_and_runs_nothing(tmp_path):
    torch.save(NotTorchvision(), tmp_path / "other.pt")
    with pytest.raises(WeightsError, match="cannot read checkpoint .*NotTorchvision.*torch.save\\(model.state_dict"):
        read_checkpoint(str(tmp_path / "other.pt"))


class NotTorchvision(torch.nn.Module):
    def forward(self, x):
        return x


def test_cocos_own_class_count_is_named_as_torchvision_names_it(tmp_path):
    torch.save(detector(classes=91).state_dict(), tmp_path / "coco.pt")
    entry = fine_tuned_entry(DETECTION, ARCH, str(tmp_path / "coco.pt"))
    assert entry.build(str(tmp_path / "coco.pt")).labels == categories(ARCH)


def test_mask_rcnn_fine_tuned_as_in_the_tutorial_answers_masks_for_its_two_classes(tmp_path):
    torch.save(maskrcnn_resnet50_checkpoint(), tmp_path / "model_1.pth")
    (tmp_path / "names.txt").write_text("\n".join(MASK_CLASSES))
    entry = fine_tuned_entry(DETECTION, "maskrcnn_resnet50_fpn", str(tmp_path / "model_1.pth"), tmp_path / "names.txt")
    assert entry.outputs == ("boxes", "labels", "scores", "masks") and entry.source["num_classes"] == 2
    assert entry.build(str(tmp_path / "model_1.pth")).labels == [BACKGROUND, *MASK_CLASSES]


def test_a_segmenter_without_its_auxiliary_head_and_one_with_it_dropped(tmp_path):
    for aux in (False, True):
        torch.manual_seed(0)
        model = torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(
            weights=None, weights_backbone=None, num_classes=3, aux_loss=aux)
        torch.save(model.state_dict(), tmp_path / f"seg{aux}.pt")
        entry = fine_tuned_entry(SEGMENTATION, "deeplabv3_mobilenet_v3_large", str(tmp_path / f"seg{aux}.pt"))
        built = entry.build(str(tmp_path / f"seg{aux}.pt")).module.eval()
        assert built.model.aux_classifier is None and entry.source["num_classes"] == 3
        assert built(torch.rand(1, 3, 64, 80)).shape == (1, 3, 64, 80)
