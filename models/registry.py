"""The registry: one `ModelEntry` per exportable model, and one `Family` per `python -m export FAMILY` command.

An entry says how to build the module (with the weights the user asked for), what its input looks like
(with the ImageContract its weights were evaluated with), which labels its outputs mean, and which probe
inputs show its control flow. A family groups entries under one command with an --arch choice. Adding a
family means one module in models/ that calls `register` for each arch and `register_family` once; the CLI
and the pipeline read everything else from the entries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from contract.errors import VisionExportError
from contract.records import CLASSIFICATION, DetectionLimits, ImageContract, InputRecord, ResizeRule


class UnknownModelError(VisionExportError, LookupError):
    """A model name that is not in the registry; the message lists the choices."""


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
    preprocessing: ImageContract | None = None  # None: not an image model the handler can serve
    resize_rule: ResizeRule | None = None  # whole-image models: one image of any size, sized by this rule
    dynamic_batch: bool = True  # False: one image per call (a detector takes a list of images, exported as one)

    def record(self) -> InputRecord:
        """The manifest's `input`: what every artifact of this model takes."""
        return InputRecord(example_shape=self.shape, dtype=self.dtype, layout=self.layout, color=self.color,
                           value_range=self.value_range, dynamic_batch=self.dynamic_batch,
                           resizes_in_graph=self.resizes_in_graph, min_size=self.min_size,
                           preprocessing=self.preprocessing, resize_rule=self.resize_rule)


@dataclass
class WeightsInfo:
    """Where a module's weights came from (the manifest's provenance record)."""

    kind: str  # imagenet | random (seeded by this tool) | path | factory (as a user's factory built them)
    requested: str
    source: str = ""
    seed: int | None = None
    sha256: str | None = None  # of the checkpoint file, when loaded from one
    note: str = ""  # a warning the user must see (e.g. random weights: predictions are meaningless)
    state_dict_sha256: str | None = None  # models.weights.state_dict_fingerprint: the same weights, same value

    def describe(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v not in (None, "")}

    def line(self) -> str:
        """What happened to the weights, in words (the export's progress line)."""
        what = {"imagenet": "trained ImageNet weights", "random": f"random, seeded by this tool (seed {self.seed})",
                "path": "loaded from a state_dict file", "factory": "as the factory built them"}.get(self.kind, self.kind)
        source = f", {self.source}" if self.source else ""
        fingerprint = f"; state_dict sha256 {self.state_dict_sha256[:16]}" if self.state_dict_sha256 else ""
        return what + source + fingerprint


@dataclass
class BuiltModel:
    module: nn.Module
    weights: WeightsInfo
    labels: list[str] | None = None


@dataclass(frozen=True)
class ModelEntry:
    name: str
    family: str  # for people and the manifest; the pipeline never branches on it (differences are fields)
    description: str
    input_spec: InputSpec
    build: Callable[[str], BuiltModel]  # weights choice -> module, provenance, labels
    # Named inputs for the trace-vs-script comparison: the first looks like the tracing example.
    probe_inputs: Callable[[], dict[str, torch.Tensor]] | None = None
    source: dict = field(default_factory=dict)  # how to rebuild (recorded in the manifest)
    # Small models: ONNX Runtime is also held to onnx.reference.ReferenceEvaluator on every probe input.
    reference_check: bool = False
    # A user's own model: a traced artifact silently diverging from eager is a prominent warning, not a note.
    warn_on_divergence: bool = False
    task: str = CLASSIFICATION  # contract.records.TASKS: what it answers, so how parity compares and who serves
    outputs: tuple[str, ...] = ("output",)  # the names of its outputs, in order
    limits: DetectionLimits | None = None  # detection: its score threshold and cap on boxes
    example: Callable[[], torch.Tensor] | None = None  # the tracing example, when uniform noise is not one
    # A trained detector: held-out photographs (none of them a probe) on which reduced precision is gated box by box.
    held_out: Callable[[], dict[str, torch.Tensor]] | None = None

    def example_input(self) -> torch.Tensor:
        if self.example is not None:
            return self.example()
        generator = torch.Generator().manual_seed(0)
        low, high = self.input_spec.value_range
        return low + (high - low) * torch.rand(self.input_spec.shape, generator=generator)


@dataclass(frozen=True)
class Family:
    """`python -m export NAME --arch ARCH`: the command, its archs (registry entries) and the default."""

    name: str
    description: str
    archs: tuple[str, ...]
    default_arch: str
    weights_help: str = "auto | imagenet | random | PATH to a state_dict (.pt/.pth)"
    entry_prefix: str = ""  # registry name = prefix + arch (efficientnet --arch lite0 -> efficientnet-lite0)
    fine_tunable: bool = False  # --weights CKPT may hold the user's own classes (--labels, --num-classes)

    def entry_name(self, arch: str) -> str:
        return self.entry_prefix + arch


_REGISTRY: dict[str, ModelEntry] = {}
_FAMILIES: dict[str, Family] = {}


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


def register_family(family: Family) -> Family:
    missing = [a for a in family.archs if family.entry_name(a) not in _REGISTRY]
    if family.name in _FAMILIES or missing or family.default_arch not in family.archs:
        raise ValueError(f"family {family.name!r}: registered twice, or archs {missing} / default "
                         f"{family.default_arch!r} not registered")
    _FAMILIES[family.name] = family
    return family


def families() -> list[Family]:
    return list(_FAMILIES.values())


def family(name: str) -> Family:
    try:
        return _FAMILIES[name]
    except KeyError:
        raise UnknownModelError(f"unknown model family {name!r}; choose one of: {', '.join(_FAMILIES)}") from None


def entry_of(family_name: str, arch: str) -> ModelEntry:
    """The entry for `python -m export FAMILY --arch ARCH`, or an error listing the family's archs."""
    chosen = family(family_name)
    if arch not in chosen.archs:
        raise UnknownModelError(f"unknown --arch {arch!r}; choose one of: {', '.join(chosen.archs)}")
    return get(chosen.entry_name(arch))
