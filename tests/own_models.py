"""A user's own detectors and segmenters, made in the tests as torchvision's fine-tuning tutorial makes them: a
torchvision architecture with its head sized for the user's classes, trained on the user's images and saved.

Here the images are generated (coloured shapes on a textured background, each class its own colour and size) and
training is a few SGD steps from seeded random weights, after which a detector's class scores are spread out with
most boxes background (a head this young scores every class alike: a hundred ties): the answers are the same on every run and the served boxes can be held
to the in-process ones. NOT a trained model: its boxes are not meant to find the shapes. The class names are the tests' own, so a test that finds them in a served answer
proves they came from --labels, not from COCO's or VOC's categories.
"""

from __future__ import annotations

import torch
import torchvision
from torch import nn
from torchvision.models.detection import MaskRCNN, fasterrcnn_mobilenet_v3_large_320_fpn
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.backbone_utils import mobilenet_backbone
from torchvision.models.segmentation import lraspp_mobilenet_v3_large
from torchvision.ops import MultiScaleRoIAlign

DETECTOR_CLASSES = ("gear", "pulley", "spring")  # + torchvision's background: 4 classes
SEGMENTER_CLASSES = ("sky", "field", "hedge")  # + background: 4 classes
MASK_CLASSES = ("pebble",)  # + background: 2 classes, as the tutorial's pedestrians
SIZE = 160  # training images' side; the detectors' own transform resizes to DETECTOR_SIZES
DETECTOR_SIZES = {"min_size": 160, "max_size": 256}  # a size this tool's table of torchvision archs never has
STEPS = 2
LOGIT_SPREAD, BACKGROUND_BIAS = 3.0, 4.0  # a random head's class logits: their spread, and background's lead
SEED = 0


def shapes(count: int, generator: torch.Generator, classes: int) -> tuple[torch.Tensor, list[dict]]:
    """`count` images 3 x SIZE x SIZE in [0, 1] with one filled rectangle per class present; targets with boxes,
    labels (1..classes-1), masks and the class map (0: background)."""
    images = 0.2 * torch.rand(count, 3, SIZE, SIZE, generator=generator) + 0.3
    targets = []
    for image in images:
        boxes, labels, masks = [], [], []
        class_map = torch.zeros(SIZE, SIZE, dtype=torch.int64)
        for label in range(1, classes):
            x1, y1 = (int(v) for v in torch.randint(0, SIZE // 2, (2,), generator=generator))
            x2, y2 = x1 + SIZE // 4 + label * 8, y1 + SIZE // 5 + label * 6
            image[:, y1:y2, x1:x2] = torch.tensor([label % 2, (label // 2) % 2, 0.9]).view(3, 1, 1)
            mask = torch.zeros(SIZE, SIZE, dtype=torch.uint8)
            mask[y1:y2, x1:x2] = 1
            class_map[y1:y2, x1:x2] = label
            boxes.append([x1, y1, x2, y2])
            labels.append(label)
            masks.append(mask)
        targets.append({"boxes": torch.tensor(boxes, dtype=torch.float32), "labels": torch.tensor(labels),
                        "masks": torch.stack(masks), "class_map": class_map})
    return images, targets


def _trained(model: nn.Module, classes: int, loss_of) -> nn.Module:
    generator = torch.Generator().manual_seed(SEED)
    optimiser = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.002, momentum=0.9)
    model.train()
    for _ in range(STEPS):
        images, targets = shapes(2, generator, classes)
        loss = loss_of(model, images, targets)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return model.eval()


def _decisive(model: nn.Module) -> nn.Module:
    """Seeded random scores spread out: the proposals' objectness (a young RPN scores anchors alike, and the top-k
    among ties would flip on a rounding difference) and the boxes' classes, most boxes background."""
    rpn, classes = model.rpn.head.cls_logits, model.roi_heads.box_predictor.cls_score
    raw = _outputs_of(model, [rpn, classes])
    with torch.no_grad():
        rpn.weight.mul_(LOGIT_SPREAD / float(torch.cat([r.flatten() for r in raw[rpn]]).std()))
        logits = raw[classes][0] - classes.bias  # per box (rows) and class (columns)
        scale = LOGIT_SPREAD / float(logits.std(0).mean())  # boxes apart, not classes
        classes.weight.mul_(scale)
        classes.bias.copy_(-scale * logits.mean(0))
        classes.bias[0] += BACKGROUND_BIAS
    return model


def _outputs_of(model: nn.Module, layers: list[nn.Module]) -> dict[nn.Module, list[torch.Tensor]]:
    """What each layer computes on one generated image (every call: the RPN's head runs once per feature map)."""
    found: dict[nn.Module, list[torch.Tensor]] = {layer: [] for layer in layers}
    hooks = [layer.register_forward_hook(lambda module, args, out: found[module].append(out.detach()))
             for layer in layers]
    try:
        with torch.no_grad():
            model.eval()(list(shapes(1, torch.Generator().manual_seed(SEED), 2)[0]))
    finally:
        for hook in hooks:
            hook.remove()
    return found


def _detection_loss(model, images, targets):
    with_masks = [{k: t[k] for k in ("boxes", "labels", "masks")} for t in targets]
    return sum(model(list(images), with_masks).values())


def _segmentation_loss(model, images, targets):
    normalised = torchvision.transforms.functional.normalize(images, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    return nn.functional.cross_entropy(model(normalised)["out"], torch.stack([t["class_map"] for t in targets]))


def fine_tuned_detector() -> nn.Module:
    """Faster R-CNN (MobileNetV3-Large FPN, 320) for DETECTOR_CLASSES, at DETECTOR_SIZES."""
    torch.manual_seed(SEED)
    model = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None,
                                                  num_classes=len(DETECTOR_CLASSES) + 1, **DETECTOR_SIZES)
    return _decisive(_trained(model, len(DETECTOR_CLASSES) + 1, _detection_loss))


def fine_tuned_segmenter() -> nn.Module:
    """LR-ASPP (MobileNetV3-Large) for SEGMENTER_CLASSES."""
    torch.manual_seed(SEED)
    model = lraspp_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=len(SEGMENTER_CLASSES) + 1)
    return _trained(model, len(SEGMENTER_CLASSES) + 1, _segmentation_loss)


def small_mask_detector() -> nn.Module:
    """Mask R-CNN on a MobileNetV3 backbone for MASK_CLASSES (the tutorial's own way to change the backbone): the
    resnet50 Mask R-CNN's export costs minutes, this one seconds."""
    torch.manual_seed(SEED)
    backbone = mobilenet_backbone(backbone_name="mobilenet_v3_large", weights=None, fpn=True, trainable_layers=6)
    maps = ["0", "1"]  # the backbone's two feature maps (and its pooled one, for the anchors)
    model = MaskRCNN(backbone, num_classes=len(MASK_CLASSES) + 1,
                     rpn_anchor_generator=AnchorGenerator(((32, 64, 128, 256),) * 3, ((0.5, 1.0, 2.0),) * 3),
                     box_roi_pool=MultiScaleRoIAlign(maps, 7, 2), mask_roi_pool=MultiScaleRoIAlign(maps, 14, 2),
                     **DETECTOR_SIZES)
    return _decisive(_trained(model, len(MASK_CLASSES) + 1, _detection_loss))


def maskrcnn_resnet50_checkpoint() -> dict:
    """torchvision's maskrcnn_resnet50_fpn for MASK_CLASSES as the tutorial makes it, one step trained, saved as
    the reference scripts save it (a training checkpoint with `model`, `args`, `epoch`)."""
    import argparse
    torch.manual_seed(SEED)
    model = torchvision.models.detection.maskrcnn_resnet50_fpn(weights=None, weights_backbone=None,
                                                               num_classes=len(MASK_CLASSES) + 1, min_size=128,
                                                               max_size=160)
    return {"model": model.state_dict(), "epoch": 0, "args": argparse.Namespace(lr=0.02, epochs=1)}
