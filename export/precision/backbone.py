"""A detector with its networks in bf16 and its geometry in fp32: the `scripted-bf16-backbone` variant.

Every Conv2d and Linear of the model computes in bf16 between fp32 tensors: its input is cast to bf16 and its
output back to fp32 (what CPU autocast does for these ops, minus autocast's bf16 outputs). So activations, pooling,
softmax and everything outside the networks (a detector's boxes, NMS, crops, image pyramid) see only fp32 tensors:
the cascade's geometry is computed exactly as in the fp32 form. The convolutions' weights are channels_last:
oneDNN's bf16 convolutions read and write NHWC, and an NCHW weight costs a reorder on every call
(docs/results/2026-11-26-detection-exports/mtcnn.md#reduced-precision measures both layouts).

Torch's autocast inside a scripted module is not an option: TorchScript casts the input but not the weights on
the CPU ("Input type (c10::BFloat16) and bias type (float) should be the same"); a wrapper module scripts.
"""

from __future__ import annotations

import copy
import io
import warnings

import torch
from torch import Tensor, nn

from contract.files import atomic_write_bytes

LAYERS = (nn.Conv2d, nn.Linear)  # the layers whose multiply-adds bf16 speeds up; the rest stay fp32


class Bf16Layer(nn.Module):
    """One Conv2d or Linear computing in bf16 between fp32 tensors (the output keeps the input's layout)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        layer = layer.to(torch.bfloat16)
        self.layer = layer.to(memory_format=torch.channels_last) if isinstance(layer, nn.Conv2d) else layer

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x.to(torch.bfloat16)).float()


def bf16_backbone(module: nn.Module) -> tuple[nn.Module, int]:
    """A copy of `module` (fp32, eval) with every Conv2d and Linear in bf16, and how many layers that is."""
    model = copy.deepcopy(module).eval()
    count = _replace_layers(model)
    return model, count


def _replace_layers(parent: nn.Module) -> int:
    count = 0
    for name, child in parent.named_children():
        if isinstance(child, LAYERS):
            setattr(parent, name, Bf16Layer(child))
            count += 1
        else:
            count += _replace_layers(child)
    return count


def save_scripted(module: nn.Module, path) -> torch.jit.ScriptModule:
    """torch.jit.script of `module`, written in one piece (as export.forms.exporters writes the fp32 one)."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit's deprecation notices
        scripted = torch.jit.script(module)
        torch.jit.save(scripted, buffer)
    atomic_write_bytes(path, buffer.getvalue())
    return scripted
