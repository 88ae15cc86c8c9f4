"""Small models with control flow, to show where `torch.jit.trace` silently records one path.

Each has probe inputs: the first resembles the tracing example, the others take a path the trace never
saw. Models whose flow depends on data also offer `torch_export_form()`: the same computation spelled
with `torch.cond` / `torch.while_loop`, which torch.export (and its ONNX exporter) keeps as If / Loop.
"""

from __future__ import annotations

import torch
from torch import nn

from models.registry import BuiltModel, InputSpec, ModelEntry, WeightsInfo, register
from models.weights import RANDOM_SEED, seeded

DEMO_SHAPE = (1, 3, 16, 16)


class ValueBranch(nn.Module):
    """Branches on the input's values: positive-sum inputs are doubled, the rest are negated and shifted."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2.0
        return 1.0 - x

    def torch_export_form(self) -> nn.Module:
        return _CondValueBranch().train(self.training)


class _CondValueBranch(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda t: t * 2.0, lambda t: 1.0 - t, (x,))


def _steps_from(x: torch.Tensor) -> torch.Tensor:
    return (x.mean() * 4).round().clamp(0, 8).to(torch.int64)  # literal bounds: TorchScript sees no globals


class DataDependentLoop(nn.Module):
    """Repeats a smoothing step as many times as the input's mean says (0..8)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = int(_steps_from(x))
        y = x
        for _ in range(steps):
            y = y * 0.5 + 1.0
        return y

    def torch_export_form(self) -> nn.Module:
        return _WhileLoopDataDependentLoop().train(self.training)


class _WhileLoopDataDependentLoop(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = _steps_from(x)

        def more(i, y):
            return i < steps

        def step(i, y):
            return i + 1, y * 0.5 + 1.0

        _, y = torch.while_loop(more, step, (torch.zeros((), dtype=torch.int64), x))
        return y


class RepeatedConv(nn.Module):
    """A convolution applied n times, n fixed at construction: tracing unrolls it, and that is correct."""

    def __init__(self, repeats: int = 3, channels: int = 3):
        super().__init__()
        self.repeats = repeats
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.repeats):
            x = torch.relu(self.conv(x))
        return x


def _demo(name: str, description: str, make, probes) -> ModelEntry:
    def build(weights: str) -> BuiltModel:
        if weights not in ("auto", "random"):
            raise ValueError(f"demo model {name} only has seeded random weights (got --weights {weights})")
        return BuiltModel(seeded(make), WeightsInfo("random", weights, seed=RANDOM_SEED))
    return register(ModelEntry(name=name, family="controlflow", description=description,
                               input_spec=InputSpec(shape=DEMO_SHAPE), build=build, probe_inputs=probes,
                               source={"registry": name}, reference_check=True))


def _rand(scale: float = 1.0, shift: float = 0.0, batch: int = 1, seed: int = 0) -> torch.Tensor:
    # seed 0 and no shift reproduce the entry's example input: the tracing example itself
    generator = torch.Generator().manual_seed(seed)
    return torch.rand((batch,) + DEMO_SHAPE[1:], generator=generator) * scale + shift


_demo("cf-branch", "if x.sum() > 0: 2x else 1 - x (branch on tensor values)", ValueBranch,
      lambda: {"positive values (as traced)": _rand(), "negative values (else branch)": _rand(shift=-1.0)})
_demo("cf-loop", "loop whose trip count is round(4 * mean(x)) (loop count from a tensor)", DataDependentLoop,
      lambda: {"mean ~0.5: 2 steps (as traced)": _rand(), "mean ~1.5: 6 steps": _rand(scale=1.0, shift=1.0)})
_demo("cf-repeat", "conv applied 3 times, fixed at construction (tracing is right here)", RepeatedConv,
      lambda: {"positive values (as traced)": _rand(), "negative values, batch 3": _rand(shift=-1.0, batch=3)})
