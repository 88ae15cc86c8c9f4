"""Put a module in eval mode and prove it: no submodule training, no grads, repeatable outputs."""

from __future__ import annotations

import torch
from torch import nn

from export.errors import EvalModeError


def prepare_for_export(module: nn.Module, example: torch.Tensor) -> torch.Tensor:
    """eval(), freeze parameters, verify; returns the eager output on `example` as the reference."""
    module.eval()
    module.requires_grad_(False)
    return verify_inference_ready(module, example)


def verify_inference_ready(module: nn.Module, example: torch.Tensor) -> torch.Tensor:
    """Raises EvalModeError unless `module` is ready; its output on `example` otherwise (the two passes that
    prove it repeatable are the only ones: a whole-image model's pass costs seconds)."""
    training = [name or "<root>" for name, sub in module.named_modules() if sub.training]
    if training:
        raise EvalModeError(
            f"submodule(s) still in training mode after eval(): {', '.join(training[:5])}; "
            "check for a train()/eval() override that ignores its argument")
    trainable = [name for name, param in module.named_parameters() if param.requires_grad]
    if trainable:
        raise EvalModeError(f"parameters still require grad: {', '.join(trainable[:5])}")
    with torch.inference_mode():
        first, second = module(example), module(example)
    if not _identical(first, second):
        culprit = _stochastic_suspect(module)
        raise EvalModeError(
            "two forward passes on the same input differ: the model is not deterministic in eval mode"
            + (f" (suspect submodule: {culprit})" if culprit else "")
            + "; remove dropout/sampling that ignores self.training")
    return first


def _identical(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_identical(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_identical(a[k], b[k]) for k in a)
    return a == b


def _stochastic_suspect(module: nn.Module) -> str | None:
    for name, sub in module.named_modules():
        if isinstance(sub, (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)):
            return name
    return None
