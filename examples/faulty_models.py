"""Three small models, each with a real fault that makes some exported form disagree with eager PyTorch: the
held-out cases of the divergence report (python -m export explain; docs/results/2026-11-25-divergence-report/). Export one with
    python -m export module examples/faulty_models.py:wrong_symbolic --input-shape 1,3,32,32 --out /tmp/faulty
and the export fails parity; parity.md then says where each failing form diverges.

- wrong_symbolic: a custom op whose ONNX symbolic is registered wrong (Swish exported as a bare Sigmoid).
- folded_batchnorm: a Conv+BatchNorm folded for deployment (taken only when exporting) with a wrong bias.
- batch_branch: a head that branches on the batch size: a trace at batch 1 bakes in the one-image path.
"""

import torch
import torch.nn.functional as F
from torch import nn


def _swish(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def _sigmoid_symbolic(g, x):
    return g.op("Sigmoid", x)  # the fault: Swish is x * sigmoid(x), this exports sigmoid(x) alone


def _register_swish() -> None:
    """faulty::swish, a custom op, with its (wrong) ONNX symbolic; once per process, however often the file loads."""
    if _registered("faulty::swish"):
        return
    op = torch.library.custom_op("faulty::swish", mutates_args=())(_swish)
    op.register_fake(lambda x: torch.empty_like(x))
    torch.onnx.register_custom_op_symbolic("faulty::swish", _sigmoid_symbolic, 9)


def _registered(name: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(name, "")
        return True
    except RuntimeError:
        return False


_register_swish()


class Swish(nn.Module):
    def forward(self, x):
        return torch.ops.faulty.swish(x)


class ConvBN(nn.Module):
    """Conv + BatchNorm that folds the BatchNorm into the convolution when exported (a common deployment step)."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        if torch.compiler.is_exporting() or torch.jit.is_tracing():
            return self.folded(x)
        return self.bn(self.conv(x))

    def folded(self, x):
        scale = self.bn.weight / torch.sqrt(self.bn.running_var + self.bn.eps)
        weight = self.conv.weight * scale.reshape(-1, 1, 1, 1)
        bias = self.bn.bias - self.bn.running_mean * self.bn.weight  # the fault: the mean must be scaled by `scale`
        return F.conv2d(x, weight, bias, padding=1)


class CentredHead(nn.Module):
    """Pools and classifies; a batch is centred on its own mean first (one image has nothing to centre on)."""

    def __init__(self, channels: int, classes: int):
        super().__init__()
        self.fc = nn.Linear(channels, classes)

    def forward(self, x):
        pooled = x.mean(dim=(2, 3))
        if pooled.shape[0] == 1:  # the fault for a trace: traced at batch 1, every batch takes this path
            return self.fc(pooled)
        return self.fc(pooled - pooled.mean(dim=0, keepdim=True))


class SmallNet(nn.Module):
    """stem -> two blocks -> head; `block` and `head` are where each fault is put."""

    def __init__(self, block: nn.Module, head: nn.Module | None = None, act: nn.Module | None = None):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.block = block
        self.act = act or nn.ReLU()
        self.head = head or nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))

    def forward(self, x):
        x = self.stem(x)
        x = self.act(self.block(x))
        return self.head(x)


def _with_batchnorm_statistics(model: nn.Module) -> nn.Module:
    """Seeded weights and non-trivial BatchNorm statistics, so a folding mistake shows."""
    torch.manual_seed(0)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
            module.weight.data.uniform_(0.5, 1.5)
            module.bias.data.uniform_(-0.2, 0.2)
    return model.eval()


def wrong_symbolic() -> nn.Module:
    return _with_batchnorm_statistics(SmallNet(nn.Conv2d(8, 8, 3, padding=1), act=Swish()))


def folded_batchnorm() -> nn.Module:
    return _with_batchnorm_statistics(SmallNet(ConvBN(8, 8)))


def batch_branch() -> nn.Module:
    head = nn.Sequential(CentredHead(8, 10))
    return _with_batchnorm_statistics(SmallNet(nn.Conv2d(8, 8, 3, padding=1), head=head))
