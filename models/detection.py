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

import torch
import torchvision
from torch import nn

from contract.errors import VisionExportError
from contract.records import DETECTION, SEGMENTATION, DetectionLimits, ResizeRule
from models.mtcnn_entry import ENTRY_NAME as MTCNN
from models.mtcnn_entry import register_mtcnn
from models.preprocess import IMAGENET_MEAN, IMAGENET_STD
from models.probes import photo_like
from models.registry import BuiltModel, Family, InputSpec, ModelEntry, WeightsInfo, register, register_family
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


def resize_rule(model: nn.Module, source: str = "") -> ResizeRule:
    """The detector's own transform (GeneralizedRCNNTransform: its min_size, max_size and fixed_size, as the model
    was built or trained) as a contract record: the handler sends images at that size."""
    transform = model.transform
    fixed = tuple(transform.fixed_size) if transform.fixed_size is not None else None
    return ResizeRule(int(transform.min_size[-1]), int(transform.max_size), fixed, source=source)


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


def torchvision_weights(arch: str, choice: str, random=None) -> tuple[nn.Module, WeightsInfo]:
    """--weights for a torchvision detector or segmenter: `coco` (its trained weights, downloaded into or read
    from the torch hub cache), `random`, `auto` (trained when cached or downloadable, else random, with the
    warning), or a state_dict PATH."""
    build = torchvision.models.get_model_builder(arch)
    random = random or random_detector
    trained = torchvision.models.get_model_weights(arch).DEFAULT
    if choice == "auto":
        cached = cached_weights_path(trained.url)
        unreachable = None if cached.exists() else download_unreachable_reason(trained.url)
        if unreachable is not None:
            model, info = random(build, choice)
            info.note = (f"trained weights {trained} are not cached ({cached}) and {trained.url} is unreachable "
                         f"({unreachable}): using seeded RANDOM weights, so the boxes are meaningless")
            return model, info
        choice = TRAINED
    if choice == TRAINED:
        model = load_torchvision_pretrained(lambda weights: build(weights=weights, weights_backbone=None), trained)
        return model, WeightsInfo(TRAINED, choice, source=f"{trained} {trained.url}")
    if choice == "random":
        return random(build, choice)
    model = seeded(lambda: build(weights=None, weights_backbone=None))
    return model, load_state_dict_file(model, choice)


# ---------------------------------------------------------------- the families

# arch -> torchvision's defaults: (min side, max side, fixed size, score threshold, detections per image, masks).
# Read from the built models by a test (tests/models/test_detection.py), so the registry need not build 12
# detectors to list them.
DETECTORS = {
    "fasterrcnn_mobilenet_v3_large_320_fpn": (320, 640, None, 0.05, 100, False),
    "fasterrcnn_mobilenet_v3_large_fpn": (800, 1333, None, 0.05, 100, False),
    "fasterrcnn_resnet50_fpn": (800, 1333, None, 0.05, 100, False),
    "fasterrcnn_resnet50_fpn_v2": (800, 1333, None, 0.05, 100, False),
    "retinanet_resnet50_fpn": (800, 1333, None, 0.05, 300, False),
    "retinanet_resnet50_fpn_v2": (800, 1333, None, 0.05, 300, False),
    "fcos_resnet50_fpn": (800, 1333, None, 0.2, 100, False),
    "ssdlite320_mobilenet_v3_large": (320, 320, (320, 320), 0.001, 300, False),
    "ssd300_vgg16": (300, 300, (300, 300), 0.01, 200, False),
    "maskrcnn_resnet50_fpn": (800, 1333, None, 0.05, 100, True),
    "maskrcnn_resnet50_fpn_v2": (800, 1333, None, 0.05, 100, True),
    "keypointrcnn_resnet50_fpn": (800, 1333, None, 0.05, 100, False),
}
DETECTION_ARCHS = tuple(DETECTORS)
NOT_SERVED = {"keypointrcnn_resnet50_fpn": "its keypoints are an output this tool neither proves nor serves (boxes "
                                           "and masks are); export it with `python -m export module` for its boxes"}
SEGMENTATION_ARCHS = ("lraspp_mobilenet_v3_large", "deeplabv3_mobilenet_v3_large", "deeplabv3_resnet50",
                      "deeplabv3_resnet101", "fcn_resnet50", "fcn_resnet101")
WEIGHTS_HELP = (f"auto | {TRAINED} | random | PATH to a checkpoint: a state_dict, a training checkpoint with "
                "'model', or a whole pickled model, fine-tuned on your own classes too (see --labels)")
EXAMPLE_ASPECT = (3, 4)  # the tracing example is a landscape photo of this height : width
SEGMENTATION_SIDE = 520  # torchvision's segmentation weights: transforms() resizes the shorter side to 520
SEGMENTATION_MAX_SIDE = 4 * SEGMENTATION_SIDE  # a panorama stops here


def categories(arch: str) -> list[str]:
    """Category names from torchvision's weights metadata (shipped with torchvision, no download)."""
    return list(torchvision.models.get_model_weights(arch).DEFAULT.meta["categories"])


def example_shape(rule: ResizeRule) -> tuple[int, int, int, int]:
    """The tracing example's shape: a landscape photo as the handler sends it under `rule`."""
    height, width = rule.size(EXAMPLE_ASPECT[0] * 100, EXAMPLE_ASPECT[1] * 100)
    return (1, 3, height, width)


def _resized(image: torch.Tensor, rule: ResizeRule) -> torch.Tensor:
    size = rule.size(*image.shape[-2:])
    return nn.functional.interpolate(image, size=size, mode="bilinear", antialias=True, align_corners=False).clamp(0, 1)


def whole_image_probes(rule: ResizeRule) -> dict[str, torch.Tensor]:
    """Images whose paths through a detector differ: the traced size, another size and aspect, an image with
    nothing in it, and real photographs (another content, another number of objects)."""
    from skimage import data  # scikit-image's sample photographs (the dev extra); read here only
    generator = torch.Generator().manual_seed(1)
    shape = example_shape(rule)
    photo = lambda array: _resized(torch.from_numpy(array).permute(2, 0, 1)[None].float() / 255, rule)  # noqa: E731
    return {"like the tracing example": photo_like(1, shape[2], shape[3], generator),
            "portrait (another size and aspect)": _resized(photo_like(1, 400, 300, generator), rule),
            "blank grey (nothing in it)": torch.full(shape, 0.5),
            "astronaut (a photograph)": photo(data.astronaut()),
            "coffee (a photograph)": photo(data.coffee())}


def example_image(rule: ResizeRule):
    """The tracing example: a seeded photo-like image of example_shape(rule)."""
    return lambda: photo_like(1, *example_shape(rule)[2:], torch.Generator().manual_seed(0))


def _detector_builder(arch: str):
    def build(weights: str) -> BuiltModel:
        if arch in NOT_SERVED:
            raise VisionExportError(f"{arch}: {NOT_SERVED[arch]}")
        model, info = torchvision_weights(arch, weights)
        return BuiltModel(flat_outputs(model.eval()), info, categories(arch))
    return build


def _detector_entry(arch: str) -> ModelEntry:
    min_side, max_side, fixed, threshold, cap, masks = DETECTORS[arch]
    rule = ResizeRule(min_side, max_side, fixed, source=f"torchvision {arch}'s transform")
    return ModelEntry(
        name=arch, family=DETECTION, task=DETECTION,
        description=f"torchvision {arch}: one image in, boxes, labels and scores{', masks' if masks else ''} out",
        input_spec=InputSpec(shape=example_shape(rule), resizes_in_graph=True, min_size=32, resize_rule=rule,
                             dynamic_batch=False),
        build=_detector_builder(arch), probe_inputs=lambda: whole_image_probes(rule), example=example_image(rule),
        source={"registry": arch}, outputs=DETECTION_OUTPUTS + ((MASK_OUTPUT,) if masks else ()),
        limits=DetectionLimits(threshold, cap))


def _segmenter_builder(arch: str):
    def build(weights: str) -> BuiltModel:
        model, info = segmenter_weights(arch, weights)
        return BuiltModel(SegmenterOutputs(model.eval()), info, categories(arch))
    return build


def segmenter_weights(arch: str, choice: str) -> tuple[nn.Module, WeightsInfo]:
    return torchvision_weights(arch, choice, random=random_segmenter)


def random_segmenter(build, choice: str) -> tuple[nn.Module, WeightsInfo]:
    def build_and_draw() -> nn.Module:
        model = build(weights=None, weights_backbone=None, aux_loss=False)
        draw_norm_statistics(SegmenterOutputs(model), STATISTICS_SIZE)
        return model
    return seeded(build_and_draw), WeightsInfo("random", choice, seed=RANDOM_SEED, note=RANDOM_NOTE)


SEGMENTATION_RULE = ResizeRule(SEGMENTATION_SIDE, SEGMENTATION_MAX_SIDE,
                               source="torchvision's segmentation weights: transforms() resize_size 520")


def _segmenter_entry(arch: str) -> ModelEntry:
    return ModelEntry(
        name=arch, family=SEGMENTATION, task=SEGMENTATION,
        description=f"torchvision {arch} with in-graph ImageNet normalisation: per-class logits at the input's size",
        input_spec=InputSpec(shape=example_shape(SEGMENTATION_RULE), resizes_in_graph=True, min_size=32,
                             resize_rule=SEGMENTATION_RULE),
        build=_segmenter_builder(arch), probe_inputs=lambda: whole_image_probes(SEGMENTATION_RULE),
        example=example_image(SEGMENTATION_RULE), source={"registry": arch})


for _arch in DETECTION_ARCHS:
    register(_detector_entry(_arch))
register_mtcnn()  # a trained face detector whose weights install offline (models/mtcnn_entry.py)
for _arch in SEGMENTATION_ARCHS:
    register(_segmenter_entry(_arch))
register_family(Family(DETECTION, "a detector: one image in, boxes, labels and scores out (torchvision's with COCO "
                                  "weights when they can be downloaded; MTCNN's trained face detector)",
                       DETECTION_ARCHS + (MTCNN,), DETECTION_ARCHS[0], WEIGHTS_HELP, fine_tunable=True))
register_family(Family(SEGMENTATION, "a torchvision segmenter: one image in, per-class logits out (COCO weights with "
                                     "VOC's classes when they can be downloaded)", SEGMENTATION_ARCHS,
                       SEGMENTATION_ARCHS[0], WEIGHTS_HELP, fine_tunable=True))
