"""A torchvision detector or segmenter fine-tuned on the user's own classes, from their checkpoint.

`python -m export detection|segmentation --arch ARCH --weights CKPT [--labels FILE] [--num-classes N]`: the
checkpoint is read in any of its three shapes (models.checkpoints); the number of classes is read from its head,
whose keys are found by building ARCH on the meta device at two class counts and seeing which shapes change (no
table of head names to keep up to date); the labels file is matched to that count with torchvision's background
class at index 0; a checkpoint that fits another --arch is named. A whole pickled model keeps its own transform
(min and max size, thresholds), so it is served at the size it was trained at.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
from pathlib import Path

import torch
import torchvision
from torch import nn

from contract.records import DETECTION, SEGMENTATION, DetectionLimits
from models.checkpoints import WHOLE_MODEL, Checkpoint, WeightsError, read_checkpoint
from models.detection import (
    DETECTION_ARCHS,
    DETECTION_OUTPUTS,
    MASK_OUTPUT,
    SEGMENTATION_ARCHS,
    SEGMENTATION_RULE,
    MaskDetectorOutputs,
    SegmenterOutputs,
    categories,
    example_image,
    example_shape,
    flat_outputs,
    max_detections,
    resize_rule,
    score_threshold,
    whole_image_probes,
)
from models.registry import BuiltModel, InputSpec, ModelEntry, WeightsInfo
from models.user_module import read_labels_file
from models.weights import file_sha256, fit_state_dict, seeded

BACKGROUND = "__background__"  # torchvision's class 0 (detectors: no object; VOC segmenters: the background)
PROBE_CLASSES = (5, 6)  # two class counts: the keys whose shapes differ between them are the head's
AUX = "aux_classifier."
SOURCE_KEY = "fine_tuned"  # manifest model.source: {"fine_tuned": arch, "task", "num_classes"}


def own_checkpoint_entry(task: str, arch: str, weights: str, labels_file=None,
                         num_classes: int | None = None) -> ModelEntry | None:
    """`export detection|segmentation --weights CKPT`: the user's model from its checkpoint (None: --weights names
    no file, or ARCH is not torchvision's: the registry's entry builds it)."""
    own = labels_file is not None or num_classes is not None
    if not os.path.isfile(weights) or arch not in DETECTION_ARCHS + SEGMENTATION_ARCHS:
        if own:
            raise WeightsError(f"--labels and --num-classes name the classes of your own checkpoint: give it with "
                               f"--weights CKPT (a file; {weights!r} is not one) and a torchvision --arch")
        return None
    if num_classes is not None and num_classes < 2:
        raise WeightsError(f"--num-classes {num_classes}: at least 2 (torchvision's background and one of yours)")
    return fine_tuned_entry(task, arch, weights, labels_file, num_classes)


def fine_tuned_entry(task: str, arch: str, checkpoint_path: str, labels_file: str | os.PathLike | None = None,
                     num_classes: int | None = None) -> ModelEntry:
    """The registry entry of the user's model: built now from the checkpoint (its transform sets the input)."""
    checkpoint = read_checkpoint(checkpoint_path)
    classes = num_classes or classes_in_head(checkpoint.state, arch)
    model = _model_from(checkpoint, arch, classes).eval()
    labels, labels_note = labels_for(labels_file, classes)
    if labels is None and classes == len(categories(arch)):  # torchvision's own classes, e.g. COCO's re-saved
        labels, labels_note = categories(arch), f"no --labels: {classes} classes, named as torchvision's weights"
    what = f"{arch} fine-tuned on {classes} classes ({checkpoint.shape} {checkpoint_path}); {labels_note}"
    weights = WeightsInfo("path", checkpoint_path, source=os.path.abspath(checkpoint_path),
                          sha256=file_sha256(checkpoint_path))
    source = {SOURCE_KEY: arch, "task": task, "num_classes": classes}
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(checkpoint_path).stem)
    if task == DETECTION:
        sizes = ("the pickled model's own transform" if checkpoint.shape == WHOLE_MODEL
                 else f"torchvision {arch}'s transform (a {checkpoint.shape} keeps none)")
        return _detector_entry(name, what, flat_outputs(model), weights, labels, source, sizes)
    return _segmenter_entry(name, what, SegmenterOutputs(model), weights, labels, source)


def _built(wrapped: nn.Module, weights: WeightsInfo, labels: list[str] | None, checkpoint: str):
    def build(choice: str) -> BuiltModel:
        if os.path.abspath(choice) != os.path.abspath(checkpoint):
            raise WeightsError(f"this entry holds the model of {checkpoint}; it cannot build --weights {choice}")
        return BuiltModel(wrapped, weights, labels)
    return build


def _detector_entry(name, what, wrapped, weights, labels, source, sizes: str) -> ModelEntry:
    model = wrapped.model
    rule = resize_rule(model, source=sizes)
    masks = (MASK_OUTPUT,) if isinstance(wrapped, MaskDetectorOutputs) else ()
    return ModelEntry(
        name=name, family=DETECTION, task=DETECTION, description=what,
        input_spec=InputSpec(shape=example_shape(rule), resizes_in_graph=True, min_size=32, resize_rule=rule,
                             dynamic_batch=False),
        build=_built(wrapped, weights, labels, weights.requested), probe_inputs=lambda: whole_image_probes(rule),
        example=example_image(rule), source=source, outputs=DETECTION_OUTPUTS + masks,
        limits=DetectionLimits(score_threshold(model), max_detections(model)))


def _segmenter_entry(name, what, wrapped, weights, labels, source) -> ModelEntry:
    return ModelEntry(
        name=name, family=SEGMENTATION, task=SEGMENTATION, description=what,
        input_spec=InputSpec(shape=example_shape(SEGMENTATION_RULE), resizes_in_graph=True, min_size=32,
                             resize_rule=SEGMENTATION_RULE),
        build=_built(wrapped, weights, labels, weights.requested),
        probe_inputs=lambda: whole_image_probes(SEGMENTATION_RULE), example=example_image(SEGMENTATION_RULE),
        source=source)


# ---------------------------------------------------------------- the head, the classes, the arch that fits

def _builder(arch: str):
    return torchvision.models.get_model_builder(arch)


def _arch(arch: str, classes: int, aux: bool, meta: bool = False) -> nn.Module:
    build = _builder(arch)
    options = {"aux_loss": aux} if "aux_loss" in inspect.signature(build).parameters else {}
    make = lambda: build(weights=None, weights_backbone=None, num_classes=classes, **options)  # noqa: E731
    if meta:
        with torch.device("meta"):
            return make()
    return seeded(make)


@functools.cache
def head_shapes(arch: str) -> dict[str, tuple[int, int, int]]:
    """{key: (dim, rows per class, rows besides)} of every parameter whose shape follows the number of classes."""
    low, high = (_arch(arch, classes, aux=True, meta=True).state_dict() for classes in PROBE_CLASSES)
    found = {}
    for key, tensor in low.items():
        if tensor.shape != high[key].shape:
            dim = next(d for d, (a, b) in enumerate(zip(tensor.shape, high[key].shape)) if a != b)
            per_class = (high[key].shape[dim] - tensor.shape[dim]) // (PROBE_CLASSES[1] - PROBE_CLASSES[0])
            found[key] = (dim, per_class, tensor.shape[dim] - per_class * PROBE_CLASSES[0])
    return found


def classes_in_head(state: dict[str, torch.Tensor], arch: str) -> int:
    """The number of classes (background included) the checkpoint's head was trained for."""
    counts = {}
    for key, (dim, per_class, besides) in head_shapes(arch).items():
        if key in state and state[key].dim() > dim:
            rows = state[key].shape[dim] - besides
            counts[key] = rows // per_class if rows % per_class == 0 else -1
    agreed = set(counts.values())
    if len(agreed) == 1 and min(agreed) >= 2:
        return agreed.pop()
    if not counts:
        raise WeightsError(f"the checkpoint has none of {arch}'s head keys ({', '.join(sorted(head_shapes(arch)))}), "
                           f"so its number of classes cannot be read: {fits_words(state, arch)}; or give "
                           "--num-classes N (background included)")
    raise WeightsError(f"the checkpoint's head keys disagree on the number of classes ({counts}): it is not a "
                       f"{arch}; {fits_words(state, arch)}")


def _model_from(checkpoint: Checkpoint, arch: str, classes: int) -> nn.Module:
    """ARCH at `classes` with the checkpoint's weights (a whole model: itself, once its keys are ARCH's); a
    segmenter's auxiliary classifier is built only when the checkpoint has one, and dropped after loading
    (it never reaches the answer)."""
    aux = any(key.startswith(AUX) for key in checkpoint.state)
    if checkpoint.shape == WHOLE_MODEL:
        model = checkpoint.model
        expected = set(_arch(arch, classes, aux, meta=True).state_dict())
        if set(checkpoint.state) != expected:
            raise WeightsError(f"{checkpoint.path} holds a whole {type(model).__name__} whose layers are not "
                               f"{arch}'s: {fits_words(checkpoint.state, arch)}")
    else:
        model = _arch(arch, classes, aux)
        try:
            fit_state_dict(model, checkpoint.state, checkpoint.path)
        except WeightsError as error:
            raise WeightsError(f"{error}; the model was built with {classes} classes{_head_words(checkpoint.state, arch)}"
                               f"; {fits_words(checkpoint.state, arch)}") from None
    if aux and hasattr(model, "aux_classifier"):
        model.aux_classifier = None
    return model


def _head_words(state: dict[str, torch.Tensor], arch: str) -> str:
    try:
        return f", the checkpoint's head has {classes_in_head(state, arch)}"
    except WeightsError:
        return ""


def fits_words(state: dict[str, torch.Tensor], arch: str) -> str:
    """Which --arch has the checkpoint's layers (by key names), in words."""
    task_archs = DETECTION_ARCHS if arch in DETECTION_ARCHS else SEGMENTATION_ARCHS
    aux = any(key.startswith(AUX) for key in state)
    fitting = [other for other in task_archs if set(_arch(other, PROBE_CLASSES[0], aux, meta=True).state_dict())
               == set(state)]
    if arch in fitting:
        return f"its layers are {arch}'s (check --num-classes)"
    if fitting:
        return f"its layers are those of --arch {' or --arch '.join(fitting)}"
    return f"its layers are none of torchvision's {', '.join(task_archs)}"


# ---------------------------------------------------------------- labels

def labels_for(labels_file, classes: int) -> tuple[list[str] | None, str]:
    """(the names of the model's class indices, in words what was done): a file naming every class keeps its
    order; one name short gets torchvision's background class at index 0."""
    if labels_file is None:
        return None, "no --labels: answers name each class by its index"
    names = read_labels_file(labels_file)
    if len(names) == classes:
        first = "its first is torchvision's background" if names[0] == BACKGROUND else f"index 0 is {names[0]!r}"
        return names, f"--labels names all {classes} classes ({first})"
    if len(names) == classes - 1 and BACKGROUND not in names:
        return [BACKGROUND] + names, (f"--labels names {len(names)} classes: {BACKGROUND} put at index 0, as "
                                      "torchvision does")
    raise WeightsError(f"--labels {labels_file} has {len(names)} names but the model has {classes} classes (index 0 "
                       f"torchvision's background): give {classes - 1} names, one per class of yours, or {classes} "
                       f"with {BACKGROUND} first; or --num-classes if the head was read wrong")
