"""A checkpoint file read safely, in the three shapes people save: a state_dict, a training checkpoint (a dict whose
`model` holds the state_dict, beside the optimizer, the scheduler and the argparse namespace, as torchvision's
reference training scripts save it), or a whole pickled model (`torch.save(model)`).

Everything is read with `torch.load(weights_only=True)`: a pickle may only name the classes allowed here, so no
checkpoint runs code. A training checkpoint may name argparse.Namespace and collections.Counter (the reference
scripts' `args` and MultiStepLR's milestones); a whole model may name what torch.nn, torchvision.models and
torchvision.ops define (modules and tensor functions; not torchvision's datasets or file functions, which could
write or download when a pickle calls them), so a pickled torchvision model loads and a model built from anyone
else's classes is refused with what to save instead.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import os
from dataclasses import dataclass

import torch
from torch import nn

from contract.errors import VisionExportError

STATE_DICT, TRAINING_CHECKPOINT, WHOLE_MODEL = "state_dict", "training checkpoint", "whole pickled model"
TRAINING_GLOBALS = (argparse.Namespace, collections.Counter)
MODEL_NAMESPACES = ("torch.nn.", "torchvision.models.", "torchvision.ops.")  # what a whole pickled model may name
STATE_KEYS = ("model", "state_dict", "model_state_dict")  # where wrappers keep the state_dict, first found wins
SAVE_A_STATE_DICT = "save one with torch.save(model.state_dict(), PATH)"


class WeightsError(VisionExportError, RuntimeError):
    """Weights could not be obtained or do not fit the module; the message says which and what to do."""


@dataclass
class Checkpoint:
    """What a checkpoint file held: its state_dict, which of the three shapes it was, and the whole model when
    it was one (it keeps its own transform's sizes and thresholds)."""

    path: str
    state: dict[str, torch.Tensor]
    shape: str
    model: nn.Module | None = None


def read_checkpoint(path: str) -> Checkpoint:
    """The checkpoint at `path`, in any of the three shapes, or a WeightsError saying what it is and what to save."""
    loaded = _load(path)
    if isinstance(loaded, nn.Module):
        return Checkpoint(path, _without_parallel_prefix(loaded.state_dict()), WHOLE_MODEL, loaded)
    shape, state = STATE_DICT, loaded
    if isinstance(loaded, dict):
        key = next((k for k in STATE_KEYS if isinstance(loaded.get(k), (dict, nn.Module))), None)
        if key is not None:
            shape, state = TRAINING_CHECKPOINT, loaded[key]
    if isinstance(state, nn.Module):  # {"model": model} (pickled whole inside a training checkpoint)
        return Checkpoint(path, _without_parallel_prefix(state.state_dict()), WHOLE_MODEL, state)
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsError(f"checkpoint {path} holds {type(loaded).__name__}, not a state_dict (parameter name -> "
                           f"tensor), a training checkpoint with one under 'model', or a whole model; "
                           f"{SAVE_A_STATE_DICT}")
    return Checkpoint(path, _without_parallel_prefix(state), shape)


def _load(path: str):
    if not os.path.isfile(path):
        raise WeightsError(f"checkpoint {path!r} is not a file")
    allowed, refused = _globals(path)
    try:
        with torch.serialization.safe_globals(list(TRAINING_GLOBALS) + allowed):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # UnpicklingError (a global not allowed), a truncated or foreign file
        why = (f"it names {', '.join(refused)}, outside what a checkpoint may name ({', '.join(MODEL_NAMESPACES)})"
               if refused else str(error).splitlines()[0])
        raise WeightsError(f"cannot read checkpoint {path}: {why}; it must be a state_dict saved with torch.save, a "
                           f"training checkpoint, or a whole torchvision model; {SAVE_A_STATE_DICT}") from None


def _globals(path: str) -> tuple[list, list[str]]:
    """(the classes and functions of MODEL_NAMESPACES the pickle names: a whole model's modules, the names of any
    others, which torch.load then refuses)."""
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # not a zip checkpoint: torch.load's own error says what it is
        return [], []
    allowed = {name: _resolve(name) for name in names if name.startswith(MODEL_NAMESPACES)}
    training = {f"{g.__module__}.{g.__qualname__}" for g in TRAINING_GLOBALS}
    refused = sorted(n for n in names if allowed.get(n) is None and n not in training)
    return [found for found in allowed.values() if found is not None], refused


def _resolve(qualified: str):
    module_name, _, attribute = qualified.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError):
        return None


def _without_parallel_prefix(state: dict) -> dict:
    """DataParallel/DistributedDataParallel checkpoints prefix every key with 'module.'."""
    if state and all(k.startswith("module.") for k in state):
        return {k[len("module."):]: v for k, v in state.items()}
    return dict(state)
