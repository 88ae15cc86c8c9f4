"""A user's own module: `path/to/file.py:factory` returning an nn.Module, entered as a registry entry."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import torch
from torch import nn

from contract.errors import VisionExportError
from contract.records import ImageContract
from models.registry import BuiltModel, InputSpec, ModelEntry, WeightsInfo
from models.user_imports import execute_user_file
from models.weights import RANDOM_SEED, load_state_dict_file, seeded, state_dict_fingerprint


class UserModuleError(VisionExportError, ValueError):
    """The FILE:factory reference cannot be loaded or does not give an nn.Module."""


def parse_input_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) < 2 or any(d <= 0 for d in shape):
        raise UserModuleError(f"--input-shape {text!r} must be positive integers separated by commas, "
                              "batch first, e.g. 1,3,224,224")
    return shape


def load_factory(reference: str):
    path, sep, name = reference.rpartition(":")
    if not sep or not path or not name:
        raise UserModuleError(f"{reference!r} must look like path/to/file.py:factory")
    if not os.path.isfile(path):
        raise UserModuleError(f"{path!r} does not exist (from {reference!r})")
    try:
        module, user_packages = execute_user_file(path, f"user_module_{Path(path).stem}")
    except Exception as error:
        raise UserModuleError(f"importing {path} failed: {type(error).__name__}: {error}") from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise UserModuleError(f"{path} has no callable named {name!r}")

    @functools.wraps(factory)
    def in_users_names(*args, **kwargs):
        with user_packages.active():
            return factory(*args, **kwargs)

    return in_users_names


def user_entry(reference: str, input_shape: tuple[int, ...], value_range=(0.0, 1.0),
               labels: list[str] | None = None) -> ModelEntry:
    """`labels`: the class names of the model's outputs (--labels FILE); None: answers name classes by index."""
    factory = load_factory(reference)

    def build(weights: str) -> BuiltModel:
        if weights == "imagenet":
            raise UserModuleError("--weights imagenet is for registry models; give your module's state_dict PATH")
        if weights in ("auto", "random"):
            module, info = factory_weights(factory, reference, weights)
        else:
            module = built_by(factory, reference)
            info = load_state_dict_file(module, weights)
        return BuiltModel(module, info, labels)

    return ModelEntry(
        name=Path(reference.rpartition(":")[0]).stem,
        family="module",
        description=f"user module {reference}",
        input_spec=InputSpec(shape=input_shape, value_range=value_range,
                             preprocessing=image_preprocessing(input_shape, value_range)),
        build=build,
        probe_inputs=lambda: probe_inputs(input_shape),
        source={"module": os.path.abspath(reference.rpartition(":")[0]) + ":" + reference.rpartition(":")[2],
                "input_shape": list(input_shape)},
        warn_on_divergence=True,
    )


def factory_weights(factory, reference: str, requested: str) -> tuple[nn.Module, WeightsInfo]:
    """The module as the factory builds it, and what its weights are: the factory is called under two random
    seeds; the same state_dict both times means it loaded (or computed) them, different ones that they are a
    random initialisation, which this tool seeded (the first call's seed, so a re-check rebuilds them)."""
    module = built_by(factory, reference, RANDOM_SEED)
    again = built_by(factory, reference, RANDOM_SEED + 1)
    if state_dict_fingerprint(module) == state_dict_fingerprint(again):
        return module, WeightsInfo("factory", requested, source="the same under any random seed (loaded or computed "
                                                                "by the factory)")
    return module, WeightsInfo("random", requested, seed=RANDOM_SEED, source="the factory's random initialisation",
                               note=RANDOM_FACTORY_NOTE)


RANDOM_FACTORY_NOTE = ("the factory's weights are a random initialisation (they change with the random seed; this "
                       f"tool seeded it with {RANDOM_SEED}): predictions are meaningless; load trained weights in "
                       "the factory or give --weights PATH")


def built_by(factory, reference: str, seed: int = RANDOM_SEED) -> nn.Module:
    module = seeded(factory, seed)
    if not isinstance(module, nn.Module):
        raise UserModuleError(f"{reference} returned {type(module).__name__}, not a torch.nn.Module")
    return module


def read_labels_file(path: str | os.PathLike) -> list[str]:
    """--labels FILE: a JSON list of names, a JSON object {"0": name, ...} with every index from 0, or one name
    per line (blank lines at the end ignored)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise UserModuleError(f"--labels {path}: cannot be read ({error.strerror or error})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = text.rstrip("\n").split("\n")
    labels = _labels_from(data, path)
    if not labels or any(not name.strip() for name in labels):
        raise UserModuleError(f"--labels {path}: {len(labels)} labels, some empty; give one name per class "
                              "(JSON list, JSON {\"0\": name}, or one name per line)")
    return [name.strip() for name in labels]


def _labels_from(data, path) -> list[str]:
    if isinstance(data, list):
        return [str(name) for name in data]
    if isinstance(data, dict):
        try:
            indexed = {int(k): str(v) for k, v in data.items()}
        except ValueError:
            raise UserModuleError(f"--labels {path}: JSON object keys must be class indices (\"0\", \"1\", ...)") from None
        if sorted(indexed) != list(range(len(indexed))):
            raise UserModuleError(f"--labels {path}: class indices must run from 0 to {len(indexed) - 1} without gaps")
        return [indexed[i] for i in range(len(indexed))]
    raise UserModuleError(f"--labels {path}: JSON must be a list of names or an object {{\"0\": name, ...}}")


def image_preprocessing(shape: tuple[int, ...], value_range) -> ImageContract | None:
    """An RGB image model (N x 3 x H x W in [0, 1]) is served by resizing the shorter side to fit the
    larger of H and W, then a centre crop of H x W; any other input is not an image the handler can serve."""
    if len(shape) != 4 or shape[1] != 3 or tuple(value_range) != (0.0, 1.0):
        return None
    height, width = shape[2], shape[3]
    return ImageContract(resize=max(height, width), crop=(height, width),
                         source="derived from --input-shape (no weights transform known)")


def probe_inputs(shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """Varied inputs: values and signs, batch sizes, and (for images) other spatial sizes."""
    generator = torch.Generator().manual_seed(7)
    rand = lambda s: torch.rand(s, generator=generator)  # noqa: E731
    probes = {
        "like the tracing example": rand(shape),
        "negative values": -rand(shape),
        "large values (x10)": 10 * rand(shape),
        "zeros": torch.zeros(shape),
        f"batch {shape[0] + 2}": rand((shape[0] + 2,) + shape[1:]),
    }
    if len(shape) == 4:
        bigger = shape[:2] + (shape[2] * 3 // 2, shape[3] * 3 // 2)
        probes[f"spatial {bigger[2]}x{bigger[3]}"] = rand(bigger)
    return probes
