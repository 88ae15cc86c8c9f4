"""`python -m export module FILE:factory`: the task a user's module answers, read from what it returns.

A list of dicts with boxes, labels and scores (and masks) is torchvision's detection output; a dict with `out`
its segmentation output, as is a tensor of class logits at the input's size when `--task segmentation` says so;
any other tensor is a classifier's, as before. A detector or segmenter gets the whole-image entry torchvision's
own get (the wrapper, the set comparison, the probes, the resize rule read from its own transform, the encoder);
a module whose output fits no task is exported as before, and the reason it is not served is given.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch
from torch import nn

from contract.records import CLASSIFICATION, DETECTION, SEGMENTATION, DetectionLimits, ResizeRule
from models.detection import (
    DETECTION_OUTPUTS,
    MASK_OUTPUT,
    example_image,
    example_shape,
    max_detections,
    resize_rule,
    score_threshold,
    whole_image_probes,
)
from models.fine_tuned import BACKGROUND, labels_for
from models.outputs import detector_outputs, is_torchvision_segmenter, segmenter_outputs
from models.registry import BuiltModel, InputSpec, ModelEntry
from models.user_module import UserModuleError, built_by, load_factory, read_labels_file, user_entry

AUTO = "auto"
TASK_CHOICES = (AUTO, CLASSIFICATION, DETECTION, SEGMENTATION)
UNLIMITED_SCORE = 0.0  # a detector without torchvision's score_thresh: every box it returns is kept
DEFAULT_MAX_DETECTIONS = 100  # ... and without detections_per_img: torchvision's default cap
SEGMENTATION_MAX_RATIO = 4  # a segmenter's longest side at most this many times its shortest (a panorama stops)
NOT_SERVED = ("the handler serves an image classifier (a N x classes tensor), torchvision's detection output (a list "
              "of dicts with boxes, labels, scores) or its segmentation output (a dict with 'out', or class logits "
              "with --task segmentation)")


@dataclass(frozen=True)
class TaskFound:
    """What the module's eager output says it answers; `task` None: no task fits, `why` says so."""

    task: str | None
    why: str
    masks: bool = False
    returns_dict: bool = False
    classes: int | None = None


def module_entry(reference: str, input_shape: tuple[int, ...], labels_file: str | os.PathLike | None = None,
                 task: str = AUTO) -> tuple[ModelEntry, TaskFound]:
    """The entry of `export module`, for the task the module's output shows (or --task), and what was found."""
    if task not in TASK_CHOICES:
        raise UserModuleError(f"--task {task!r}: choose one of {', '.join(TASK_CHOICES)}")
    if task == CLASSIFICATION:
        return _classifier(reference, input_shape, labels_file), TaskFound(CLASSIFICATION, "--task classification")
    module = built_by(load_factory(reference), reference).eval()
    try:
        output = _eager_output(module, input_shape)
    except UserModuleError as error:
        if task != AUTO:
            raise
        why = f"{error}: exported as before, so the export's own checks say where"
        return _classifier(reference, input_shape, labels_file), TaskFound(CLASSIFICATION, why)
    found = task_of(output, input_shape, task)
    if found.task == DETECTION:
        return _detector(reference, input_shape, labels_file, module, found), found
    if found.task == SEGMENTATION:
        return _segmenter(reference, input_shape, labels_file, module, found), found
    return _classifier(reference, input_shape, labels_file, found.task), found


def _eager_output(module: nn.Module, input_shape: tuple[int, ...]):
    example = torch.rand(input_shape, generator=torch.Generator().manual_seed(0))
    try:
        with torch.no_grad():
            return module(example)
    except Exception as error:  # the user's code: its own error, named
        raise UserModuleError(f"the module failed on an input of shape {tuple(input_shape)}: "
                              f"{type(error).__name__}: {error}") from None


def task_of(output, input_shape: tuple[int, ...], forced: str = AUTO) -> TaskFound:
    """Which task an eager output fits (torchvision's conventions), checked against --task when given."""
    found = _fitting(output, input_shape, forced == SEGMENTATION)
    if forced not in (AUTO, found.task):
        raise UserModuleError(f"--task {forced}: the module's output does not fit it ({found.why}); "
                              f"{NOT_SERVED}")
    return found


def _fitting(output, input_shape, logits_are_maps: bool) -> TaskFound:
    if isinstance(output, (list, tuple)) and output and all(isinstance(o, dict) for o in output):
        missing = [k for k in DETECTION_OUTPUTS if k not in output[0]]
        if missing:
            return TaskFound(None, f"it returns a list of dicts without {', '.join(missing)}")
        return TaskFound(DETECTION, f"it returns a list of dicts with {', '.join(output[0])}",
                         masks=MASK_OUTPUT in output[0])
    if isinstance(output, dict):
        if isinstance(output.get("out"), torch.Tensor) and output["out"].dim() == 4:
            return TaskFound(SEGMENTATION, "it returns a dict with 'out'", returns_dict=True,
                             classes=output["out"].shape[1])
        return TaskFound(None, f"it returns a dict with {', '.join(map(str, output)) or 'no keys'} (no 'out')")
    if isinstance(output, torch.Tensor):
        maps = output.dim() == 4 and tuple(output.shape[-2:]) == tuple(input_shape[-2:])
        if logits_are_maps and maps:
            return TaskFound(SEGMENTATION, "--task segmentation: a tensor of class logits at the input's size",
                             classes=output.shape[1])
        if logits_are_maps:
            return TaskFound(CLASSIFICATION, f"a tensor of shape {tuple(output.shape)}, not class logits at the "
                                             f"input's size {tuple(input_shape[-2:])}")
        hint = "; per-pixel class logits? give --task segmentation" if maps else ""
        return TaskFound(CLASSIFICATION, f"it returns a tensor of shape {tuple(output.shape)}{hint}")
    return TaskFound(None, f"it returns {type(output).__name__}")


def _classifier(reference, input_shape, labels_file, task: str | None = CLASSIFICATION) -> ModelEntry:
    """As before this module: a classifier's entry (or, no task fitting, the module as it is, not served)."""
    entry = user_entry(reference, input_shape, labels=read_labels_file(labels_file) if labels_file else None)
    return replace(entry, source={**entry.source, "task": task or AUTO})


def _task_entry(reference, input_shape, wrap, labels, task: str, outputs, rule: ResizeRule, **fields) -> ModelEntry:
    """A whole-image entry: the factory's module (its weights as `export module` gets them), wrapped."""
    base = user_entry(reference, input_shape)

    def build(weights: str) -> BuiltModel:
        built = base.build(weights)
        return BuiltModel(wrap(built.module.eval()), built.weights, labels)

    return replace(base, task=task, family=task, outputs=outputs, build=build, probe_inputs=lambda: whole_image_probes(rule),
                   example=example_image(rule), source={**base.source, "task": task},
                   description=f"{base.description}: a {task} model in torchvision's conventions", **fields)


def _detector(reference, input_shape, labels_file, module: nn.Module, found: TaskFound) -> ModelEntry:
    if hasattr(module, "transform") and hasattr(module.transform, "min_size"):
        rule = resize_rule(module, source="the module's own transform (GeneralizedRCNNTransform)")
    else:
        rule = ResizeRule(min(input_shape[-2:]), max(input_shape[-2:]), source="--input-shape (the module has no "
                                                                                 "GeneralizedRCNNTransform)")
    labels, labels_note = _detector_labels(labels_file, _classes_of(module))
    outputs = DETECTION_OUTPUTS + ((MASK_OUTPUT,) if found.masks else ())
    entry = _task_entry(reference, input_shape, lambda m: detector_outputs(m, found.masks), labels, DETECTION,
                        outputs, rule, limits=_limits(module),
                        input_spec=InputSpec(shape=example_shape(rule), resizes_in_graph=True, min_size=32,
                                             resize_rule=rule, dynamic_batch=False))
    return replace(entry, description=f"{entry.description}; resized as {rule.source} says; {labels_note}")


def _segmenter(reference, input_shape, labels_file, module: nn.Module, found: TaskFound) -> ModelEntry:
    shortest = min(input_shape[-2:])
    rule = ResizeRule(shortest, max(SEGMENTATION_MAX_RATIO * shortest, max(input_shape[-2:])),
                      source="--input-shape's shorter side")
    labels, labels_note = labels_for(labels_file, found.classes)
    entry = _task_entry(reference, input_shape, lambda m: segmenter_outputs(m, found.returns_dict), labels,
                        SEGMENTATION, ("output",), rule,
                        input_spec=InputSpec(shape=example_shape(rule), resizes_in_graph=True, min_size=32,
                                             resize_rule=rule))
    normalised = (" (ImageNet normalisation added in the graph, as torchvision's segmentation training normalises)"
                  if is_torchvision_segmenter(module) else "")
    return replace(entry, description=f"{entry.description}{normalised}; {labels_note}")


def _detector_labels(labels_file, classes: int | None):
    """Labels of a detector: matched to its head when it is torchvision's; else background first, as torchvision's."""
    if labels_file is None:
        return None, "no --labels: answers name each class by its index"
    if classes is not None:
        return labels_for(labels_file, classes)
    names = read_labels_file(labels_file)
    if names[0] == BACKGROUND:
        return names, "--labels starts with torchvision's background"
    return [BACKGROUND] + names, f"{BACKGROUND} put at index 0, as torchvision's detectors count from 1"


def _classes_of(module: nn.Module) -> int | None:
    """The classes of a torchvision detector's head (background included), where it has one this tool knows."""
    for path in ("roi_heads.box_predictor.cls_score", "head.classification_head"):
        try:
            layer = module.get_submodule(path)
        except AttributeError:
            continue
        return int(getattr(layer, "out_features", None) or getattr(layer, "num_classes", 0)) or None
    return None


def _limits(module: nn.Module) -> DetectionLimits:
    try:
        return DetectionLimits(score_threshold(module), max_detections(module))
    except AttributeError:  # not torchvision's: no score_thresh, no detections_per_img
        return DetectionLimits(UNLIMITED_SCORE, DEFAULT_MAX_DETECTIONS)
