"""torchvision's detectors and segmenters as exportable modules: one image in, flat tensors out.

torchvision's detection models take a list of images and return a list of dicts (scripted: a pair of losses and
that list); exporters want tensors. `DetectorOutputs` takes one image batch of one, 1 x 3 x H x W in [0, 1] at any
size (the model's own transform resizes and normalises it), and returns torchvision's conventions as a tuple:
boxes (N x 4, x1 y1 x2 y2 in the input's pixels), labels (N, int64, COCO category indices), scores (N), and for
Mask R-CNN masks (N x 1 x H x W, probabilities). `SegmenterOutputs` normalises in its graph and returns the
per-class logits at the input's size (1 x C x H x W).

Random weights (`--weights random`, or `auto` where torchvision's cannot be downloaded) must still give boxes, or
nothing would be compared: the backbone's BatchNorm statistics are measured on seeded images (models.weights),
and the classification layers are made decisive (weights scaled, biases at zero), so a few classes stand out of
each box's scores and torchvision's own score thresholds keep some boxes and drop most (docs/detection.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torchvision
from torch import nn

from models.preprocess import IMAGENET_MEAN, IMAGENET_STD
from models.probes import photo_like
from models.registry import WeightsInfo
from models.weights import (
    RANDOM_NOTE,
    RANDOM_SEED,
    cached_weights_path,
    download_unreachable_reason,
    draw_norm_statistics,
    load_state_dict_file,
    load_torchvision_pretrained,
    seeded,
)

DETECTION_OUTPUTS = ("boxes", "labels", "scores")
MASK_OUTPUT = "masks"
CANDIDATES = 60  # random classification layers: (box, class) pairs above the score threshold on a seeded image
SOFTMAX_BIAS = 0.0  # per-box softmax over the classes (R-CNN, SSD): no class favoured
SIGMOID_BIAS = -4.0  # per-anchor sigmoid per class (RetinaNet, FCOS): most anchors score low, as a prior does
TRAINED = "coco"  # --weights: torchvision's trained weights for these tasks (COCO, or VOC's classes on COCO)
STATISTICS_SIZE = 320  # the seeded images that set the backbone's BatchNorm statistics (random weights)


class DetectorOutputs(nn.Module):
    """A torchvision detector with one image in and (boxes, labels, scores) out, eager, traced and scripted alike."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def detections(self, image: torch.Tensor) -> dict[str, torch.Tensor]:
        images = [image[0]]
        if torch.jit.is_scripting():
            return self.model(images)[1][0]  # scripted, torchvision returns (losses, detections)
        return self.model(images)[0]

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        found = self.detections(image)
        return found["boxes"], found["labels"], found["scores"]


class MaskDetectorOutputs(DetectorOutputs):
    """Mask R-CNN: (boxes, labels, scores, masks), masks N x 1 x H x W probabilities at the input's size."""

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        found = self.detections(image)
        return found["boxes"], found["labels"], found["scores"], found["masks"]


def flat_outputs(model: nn.Module) -> DetectorOutputs:
    has_masks = hasattr(model, "roi_heads") and model.roi_heads.has_mask()
    return (MaskDetectorOutputs if has_masks else DetectorOutputs)(model)


class SegmenterOutputs(nn.Module):
    """A torchvision segmenter with ImageNet normalisation in its graph: [0, 1] in, per-class logits out."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.model((image - self.mean) / self.std)["out"]


@dataclass(frozen=True)
class ResizeRule:
    """How the model's own transform sizes an image: shorter side to `min_side` unless the longer one would pass
    `max_side` (torchvision's GeneralizedRCNNTransform), or exactly `fixed` (SSD). The handler sends images already
    at that size, so the model's resize changes nothing and a 12 MP photo is not copied whole into the graph."""

    min_side: int
    max_side: int
    fixed: tuple[int, int] | None = None

    def scale(self, height: int, width: int) -> float:
        """The factor the model's transform would apply (for a fixed size: to fit the larger side)."""
        if self.fixed is not None:
            return min(self.fixed[0] / height, self.fixed[1] / width)
        return min(self.min_side / min(height, width), self.max_side / max(height, width))

    @classmethod
    def of(cls, model: nn.Module) -> ResizeRule:
        transform = model.transform
        fixed = tuple(transform.fixed_size) if transform.fixed_size is not None else None
        return cls(int(transform.min_size[-1]), int(transform.max_size), fixed)


def decisive_heads(model: nn.Module) -> None:
    """Random classification layers made decisive: biases set (SOFTMAX_BIAS, or SIGMOID_BIAS as a prior does),
    weights scaled so that on a seeded image about CANDIDATES (box, class) pairs score above the model's own
    threshold before NMS. The scores then spread across the threshold, the count depends on the image (a blank
    image keeps fewer boxes than a busy one), and few boxes sit at its edge."""
    heads = classification_heads(model)
    raw = _raw_logits(model, [layer for layer, _ in heads])
    threshold = score_threshold(model)
    with torch.no_grad():
        for layer, classes in heads:
            bias = SIGMOID_BIAS if classes is None else SOFTMAX_BIAS
            layer.weight.mul_(_scale_for(raw[layer], classes, bias, threshold))
            if layer.bias is not None:
                layer.bias.fill_(bias)


def _raw_logits(model: nn.Module, layers: list[nn.Module]) -> dict[nn.Module, torch.Tensor]:
    """What each classification layer computes, its bias left out, on one seeded photo-like image."""
    captured: dict[nn.Module, torch.Tensor] = {}

    def keep(layer, args, out):
        bias = layer.bias.view(1, -1, *([1] * (out.dim() - 2))) if layer.bias is not None else 0.0
        captured[layer] = (out - bias).detach()

    hooks = [layer.register_forward_hook(keep) for layer in layers]
    try:
        with torch.no_grad():
            model.eval()(list(photo_like(1, STATISTICS_SIZE, STATISTICS_SIZE,
                                         torch.Generator().manual_seed(RANDOM_SEED))))
    finally:
        for hook in hooks:
            hook.remove()
    return captured


def _scale_for(raw: torch.Tensor, classes: int | None, bias: float, threshold: float) -> float:
    """The weight scale (bisected in log space) at which about CANDIDATES scores pass the threshold."""
    if classes is not None:  # softmax over each row of `classes` logits (a box, or an anchor of a feature map)
        raw = raw.movedim(1, -1).reshape(-1, classes) if raw.dim() == 4 else raw.reshape(-1, classes)

    def passing(scale: float) -> int:
        logits = raw * scale + bias
        scores = torch.sigmoid(logits) if classes is None else torch.softmax(logits, dim=-1)[:, 1:]
        return int((scores > threshold).sum())

    low, high = -4.0, 4.0  # log10 of the scale
    for _ in range(30):
        middle = (low + high) / 2
        low, high = (middle, high) if passing(10 ** middle) < CANDIDATES else (low, middle)
    return 10 ** high


def score_threshold(model: nn.Module) -> float:
    return float(model.roi_heads.score_thresh if _has(model, "roi_heads") else model.score_thresh)


def max_detections(model: nn.Module) -> int:
    return int(model.roi_heads.detections_per_img if _has(model, "roi_heads") else model.detections_per_img)


def classification_heads(model: nn.Module) -> list[tuple[nn.Module, int | None]]:
    """(the layer that scores classes, the classes of its softmax rows, or None for a per-class sigmoid):
    R-CNN's box predictor, SSD's last convolution per feature map, RetinaNet's and FCOS's cls_logits."""
    if _has(model, "roi_heads"):
        layer = model.roi_heads.box_predictor.cls_score
        return [(layer, layer.out_features)]
    head = model.head.classification_head
    if hasattr(head, "module_list"):  # SSD: one branch per feature map, softmax over num_columns per anchor
        return [([m for m in branch.modules() if isinstance(m, nn.Conv2d)][-1], head.num_columns)
                for branch in head.module_list]
    return [(head.cls_logits, None)]


def _has(model: nn.Module, name: str) -> bool:
    try:
        model.get_submodule(name)
    except AttributeError:
        return False
    return True


def backbone_statistics(model: nn.Module) -> None:
    """BatchNorm statistics measured through the backbone (a detector in training mode wants targets)."""
    class Backbone(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = model.backbone

        def forward(self, x):
            return self.body(x)

    draw_norm_statistics(Backbone(), STATISTICS_SIZE)


def random_detector(build, choice: str) -> tuple[nn.Module, WeightsInfo]:
    def build_and_draw() -> nn.Module:
        model = build(weights=None, weights_backbone=None)
        backbone_statistics(model)
        decisive_heads(model)
        return model
    return seeded(build_and_draw), WeightsInfo("random", choice, seed=RANDOM_SEED, note=RANDOM_NOTE,
                                               source=f"classification layers scaled to {CANDIDATES} candidate boxes on a seeded image")


def torchvision_weights(arch: str, choice: str) -> tuple[nn.Module, WeightsInfo]:
    """--weights for a torchvision detector or segmenter: `coco` (its trained weights, downloaded into or read
    from the torch hub cache), `random`, `auto` (trained when cached or downloadable, else random, with the
    warning), or a state_dict PATH."""
    build = torchvision.models.get_model_builder(arch)
    trained = torchvision.models.get_model_weights(arch).DEFAULT
    if choice == "auto":
        cached = cached_weights_path(trained.url)
        unreachable = None if cached.exists() else download_unreachable_reason(trained.url)
        if unreachable is not None:
            model, info = random_detector(build, choice)
            info.note = (f"trained weights {trained} are not cached ({cached}) and {trained.url} is unreachable "
                         f"({unreachable}): using seeded RANDOM weights, so the boxes are meaningless")
            return model, info
        choice = TRAINED
    if choice == TRAINED:
        model = load_torchvision_pretrained(lambda weights: build(weights=weights, weights_backbone=None), trained)
        return model, WeightsInfo(TRAINED, choice, source=f"{trained} {trained.url}")
    if choice == "random":
        return random_detector(build, choice)
    model = seeded(lambda: build(weights=None, weights_backbone=None))
    return model, load_state_dict_file(model, choice)
