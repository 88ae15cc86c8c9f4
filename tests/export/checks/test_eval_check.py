import pytest
import torch
from torch import nn

from export.checks.eval_mode import prepare_for_export
from export.errors import EvalModeError


class StuckDropout(nn.Module):
    """A model whose train() override forgets its dropout: eval() leaves that submodule training."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.head_dropout = nn.Dropout(0.5)

    def train(self, mode: bool = True):
        super().train(mode)
        self.head_dropout.training = True
        return self

    def forward(self, x):
        return self.head_dropout(self.body(x))


class SneakyNoise(nn.Module):
    """Calls dropout functionally with training=True: every submodule is in eval mode, outputs still vary."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)

    def forward(self, x):
        return nn.functional.dropout(self.body(x), p=0.5, training=True)


def test_submodule_left_training_is_named():
    with pytest.raises(EvalModeError, match="head_dropout"):
        prepare_for_export(StuckDropout(), torch.rand(2, 4))


def test_nondeterministic_forward_is_refused():
    with pytest.raises(EvalModeError, match="not deterministic"):
        prepare_for_export(SneakyNoise(), torch.rand(8, 4))


def test_healthy_module_passes_and_is_frozen():
    module = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.BatchNorm1d(4))
    reference = prepare_for_export(module, torch.rand(3, 4))
    assert reference.shape == (3, 4)
    assert not module.training and not any(p.requires_grad for p in module.parameters())


def test_the_reference_is_one_of_the_two_passes_that_prove_it_repeatable():
    module = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    example = torch.rand(3, 4)
    passes = []
    module.register_forward_hook(lambda _module, _inputs, output: passes.append(output))
    reference = prepare_for_export(module, example)
    assert len(passes) == 2 and reference is passes[0]
    assert torch.equal(reference, module(example))
