"""Output adapters for any module in torchvision's conventions: its outputs made the flat tensors our detection and
segmentation wrappers give, so the comparators, probes, encoders and gates made for torchvision's models apply.

torchvision's own detectors return (losses, detections) when scripted, and are wrapped by models.detection's
DetectorOutputs; a module of the user's that returns the list of dicts eager and scripted alike takes the List
variants here. A segmenter's dict with `out` is read by OutSegmenterOutputs; torchvision's own segmenters take
ImageNet-normalised images (their reference training normalises outside the model), so SegmenterOutputs adds
that normalisation in the graph for them.
"""

from __future__ import annotations

import torch
from torch import nn

from models.detection import DetectorOutputs, MaskDetectorOutputs, SegmenterOutputs

TORCHVISION_SEGMENTERS = "torchvision.models.segmentation."


class ListDetectorOutputs(DetectorOutputs):
    """A detector returning a list of dicts (boxes, labels, scores) scripted too: (boxes, labels, scores)."""

    def detections(self, image: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.model([image[0]])[0]


class ListMaskDetectorOutputs(MaskDetectorOutputs):
    """The same with instance masks: (boxes, labels, scores, masks)."""

    def detections(self, image: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.model([image[0]])[0]


class OutSegmenterOutputs(nn.Module):
    """A segmenter returning {"out": N x C x H x W logits, ...}: the logits (it normalises its input itself)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.model(image)["out"]


def is_torchvision_detector(model: nn.Module) -> bool:
    """torchvision's detectors (GeneralizedRCNN, RetinaNet, FCOS, SSD) return (losses, detections) scripted."""
    return callable(getattr(model, "eager_outputs", None)) and type(model).__module__.startswith("torchvision.")


def is_torchvision_segmenter(model: nn.Module) -> bool:
    return type(model).__module__.startswith(TORCHVISION_SEGMENTERS)


def detector_outputs(model: nn.Module, masks: bool) -> DetectorOutputs:
    if is_torchvision_detector(model):
        return (MaskDetectorOutputs if masks else DetectorOutputs)(model)
    return (ListMaskDetectorOutputs if masks else ListDetectorOutputs)(model)


def segmenter_outputs(model: nn.Module, returns_dict: bool) -> nn.Module:
    """The wrapper for a segmenter's output (a plain logit tensor needs none)."""
    if is_torchvision_segmenter(model):
        return SegmenterOutputs(model)
    return OutSegmenterOutputs(model) if returns_dict else model
