"""torchvision's detectors and segmenters as registry entries (models.detection): the table of their defaults
matches torchvision, the flat wrappers, and random weights that still give boxes."""

from __future__ import annotations

import pytest
import torch
import torchvision

import models
from contract.records import DETECTION, SEGMENTATION
from models import detection


@pytest.mark.slow
@pytest.mark.parametrize("arch", detection.DETECTION_ARCHS)
def test_the_table_holds_torchvisions_own_sizes_and_limits(arch):
    model = torchvision.models.get_model(arch, weights=None, weights_backbone=None)
    min_side, max_side, fixed, threshold, cap, masks = detection.DETECTORS[arch]
    rule = detection.resize_rule(model)
    assert (rule.min_side, rule.max_side, rule.fixed) == (min_side, max_side, fixed)
    assert (detection.score_threshold(model), detection.max_detections(model)) == (threshold, cap)
    assert (hasattr(model, "roi_heads") and model.roi_heads.has_mask()) == masks


def test_the_families_list_every_torchvision_detector_and_segmenter():
    assert set(models.family(DETECTION).archs) == set(torchvision.models.list_models(
        module=torchvision.models.detection)) | {"mtcnn"}
    assert set(models.family(SEGMENTATION).archs) == set(
        torchvision.models.list_models(module=torchvision.models.segmentation))
    entry = models.get("fasterrcnn_mobilenet_v3_large_320_fpn")
    assert entry.task == DETECTION and entry.input_spec.shape == (1, 3, 320, 427) and not entry.input_spec.dynamic_batch
    assert entry.outputs == ("boxes", "labels", "scores") and models.get("maskrcnn_resnet50_fpn_v2").outputs[-1] == "masks"
    assert entry.example_input().shape == (1, 3, 320, 427)


def test_keypoint_rcnn_is_refused_with_the_reason():
    with pytest.raises(models.registry.VisionExportError, match="keypoints are an output this tool neither proves"):
        models.get("keypointrcnn_resnet50_fpn").build("random")


def test_random_weights_give_boxes_that_depend_on_the_image():
    built = models.get("fasterrcnn_mobilenet_v3_large_320_fpn").build("random")
    assert built.weights.kind == "random" and "candidate boxes" in built.weights.source
    assert built.labels[1] == "person" and len(built.labels) == 91
    probes = models.get("fasterrcnn_mobilenet_v3_large_320_fpn").probe_inputs()
    with torch.no_grad():
        counts = {name: len(built.module(image)[2]) for name, image in probes.items()}
        boxes, labels, scores = built.module(probes["like the tracing example"])
    assert boxes.shape[1] == 4 and labels.dtype == torch.int64 and scores.dtype == torch.float32
    assert all(count > 0 for count in counts.values()) and len(set(counts.values())) > 1, counts
    assert counts["blank grey (nothing in it)"] < counts["like the tracing example"]
    assert float(scores.min()) >= 0.05  # torchvision's own threshold still applies


def test_a_random_segmenter_answers_per_class_logits_at_the_input_size():
    built = models.get("lraspp_mobilenet_v3_large").build("random")
    image = models.get("lraspp_mobilenet_v3_large").example_input()
    with torch.no_grad():
        logits = built.module(image)
    assert logits.shape == (1, 21, *image.shape[-2:]) and built.labels[15] == "person"
    assert len(logits.argmax(1).unique()) > 1  # not one class everywhere
