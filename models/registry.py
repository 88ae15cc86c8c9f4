"""The registry: one `ModelEntry` per exportable model.

An entry says how to build the module (with the weights the user asked for), what its input looks like,
which labels its outputs mean, and which probe inputs show its control flow. Adding a model means adding
one entry with `register`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from models.errors import VisionExportError


class UnknownModelError(VisionExportError, LookupError):
    """A model name that is not in the registry; the message lists the choices."""


@dataclass(frozen=True)
class Preprocessing:
    """How a decoded RGB image becomes one input row: the serving contract the handler reads from the
    manifest. Normalisation is not here: it is inside the exported graph."""

    resize: int  # the shorter side is resized to this many pixels
    crop: tuple[int, int]  # then a centre crop of (height, width)
    interpolation: str = "bilinear"
    antialias: bool = True
    source: str = ""  # where these numbers come from (e.g. the weights' own transforms())

    def describe(self) -> dict:
        return {"resize": self.resize, "crop": list(self.crop), "interpolation": self.interpolation,
                "antialias": self.antialias, "scale": "uint8 / 255 -> [0, 1]", "source": self.source}


@dataclass(frozen=True)
class InputSpec:
    """The contract an exported artifact's input must meet (written into the manifest)."""

    shape: tuple[int, ...]  # example shape, batch first
    dtype: str = "float32"
    layout: str = "NCHW"
    color: str = "RGB"
    value_range: tuple[float, float] = (0.0, 1.0)
    # Any spatial size at or above min_size is resized in the graph (scripted/ONNX-from-script/cond forms).
    resizes_in_graph: bool = False
    min_size: int = 0
    preprocessing: Preprocessing | None = None  # None: not an image model the handler can serve

    def describe(self) -> dict:
        return {
            "preprocessing": self.preprocessing.describe() if self.preprocessing else None,
            "example_shape": list(self.shape),
            "dtype": self.dtype,
            "layout": self.layout,
            "color": self.color,
            "value_range": list(self.value_range),
            "dynamic_batch": True,
            "resizes_in_graph": self.resizes_in_graph,
            "min_size": self.min_size,
        }


@dataclass
class WeightsInfo:
    """Where a module's weights came from (the manifest's provenance record)."""

    kind: str  # imagenet | random | path
    requested: str
    source: str = ""
    seed: int | None = None
    sha256: str | None = None
    note: str = ""

    def describe(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v not in (None, "")}


@dataclass
class BuiltModel:
    module: nn.Module
    weights: WeightsInfo
    labels: list[str] | None = None


@dataclass(frozen=True)
class ModelEntry:
    name: str
    family: str  # resnet | controlflow | module
    description: str
    input_spec: InputSpec
    build: Callable[[str], BuiltModel]  # weights choice -> module, provenance, labels
    # Named inputs for the trace-vs-script comparison: the first looks like the tracing example.
    probe_inputs: Callable[[], dict[str, torch.Tensor]] | None = None
    source: dict = field(default_factory=dict)  # how to rebuild (recorded in the manifest)

    def example_input(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed(0)
        low, high = self.input_spec.value_range
        return low + (high - low) * torch.rand(self.input_spec.shape, generator=generator)


_REGISTRY: dict[str, ModelEntry] = {}


def register(entry: ModelEntry) -> ModelEntry:
    if entry.name in _REGISTRY:
        raise ValueError(f"model {entry.name!r} is registered twice")
    _REGISTRY[entry.name] = entry
    return entry


def get(name: str) -> ModelEntry:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownModelError(
            f"unknown model {name!r}; choose one of: {', '.join(sorted(_REGISTRY))}"
        ) from None


def names(family: str | None = None) -> list[str]:
    return sorted(n for n, e in _REGISTRY.items() if family is None or e.family == family)
