"""A wrongly folded BatchNorm must fail parity, which needs BatchNorm terms that are not the identity.

An exporter that folds BatchNorm into the convolution before it can get a term wrong: ignore the running
variance or mean, or use another epsilon. Such a fold is simulated by exporting, with the project's own
exporters, a copy of the module carrying that mistake, then holding the artifact to the true eager module.
"""

import copy

import pytest
import torch
from torch import nn

import models
from export.checks.parity import UnderTest, parity_inputs, run_parity
from export.forms import exporters, kinds
from runtime import open_artifact
from runtime.eager import EagerBackend

pytestmark = pytest.mark.slow  # one ONNX export and parity run of resnet18 per case, ~7 s each on 2 cores

KIND = "onnx-traced"  # the legacy exporter folds BatchNorm into the convolution (constant folding)
WRONG_EPS = 1e-3  # resnet18's BatchNorm uses 1e-5


def ignore_running_variance(layer: nn.BatchNorm2d) -> None:
    layer.running_var.fill_(1.0)


def ignore_running_mean(layer: nn.BatchNorm2d) -> None:
    layer.running_mean.zero_()


def use_another_epsilon(layer: nn.BatchNorm2d) -> None:
    layer.eps = WRONG_EPS


def folded_wrongly(module: nn.Module, mistake) -> nn.Module:
    wrong = copy.deepcopy(module)
    with torch.no_grad():
        for layer in wrong.modules():
            if isinstance(layer, nn.BatchNorm2d):
                mistake(layer)
    return wrong


def export_onnx(module: nn.Module, folder) -> exporters.Artifact:
    """The pipeline's exporter functions for KIND and the kinds it needs, in table order."""
    example = torch.rand(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    context = exporters.BuildContext(module, module, example, folder, exporters.DEFAULT_OPSET, resizes_in_graph=False)
    for name in kinds.get(KIND).needs + (KIND,):
        kind = kinds.get(name)
        context.built[name] = kind.build(context, kind)
    return context.built[KIND]


def parity_against(truth: nn.Module, exported_from: nn.Module, folder) -> bool:
    artifact = export_onnx(exported_from, folder)
    candidate = UnderTest(open_artifact(artifact.format, artifact.path), kinds.get(KIND).tolerance, False)
    report = run_parity(EagerBackend(truth), {KIND: candidate}, parity_inputs((1, 3, 224, 224)))
    return report.passed(KIND)


@pytest.fixture(scope="module")
def drawn() -> nn.Module:
    return models.get("resnet18").build("random").module.eval()


@pytest.fixture(scope="module")
def fresh(drawn) -> nn.Module:
    """The same network with every BatchNorm as a fresh layer has it: the identity."""
    module = copy.deepcopy(drawn)
    for layer in module.modules():
        if isinstance(layer, nn.BatchNorm2d):
            layer.reset_parameters()
    return module


def test_the_correct_fold_passes(drawn, tmp_path):
    assert parity_against(drawn, drawn, tmp_path)


@pytest.mark.parametrize("mistake", [ignore_running_variance, ignore_running_mean, use_another_epsilon])
def test_a_wrong_fold_fails_parity_with_drawn_statistics(drawn, mistake, tmp_path):
    assert not parity_against(drawn, folded_wrongly(drawn, mistake), tmp_path)


def test_identity_batchnorm_hides_the_same_wrong_fold(fresh, tmp_path):
    # Why --weights random draws the statistics: on a fresh network ignoring the variance changes nothing.
    assert parity_against(fresh, folded_wrongly(fresh, ignore_running_variance), tmp_path)
