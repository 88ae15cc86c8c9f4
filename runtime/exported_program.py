"""torch.export's ExportedProgram (`torch.export.save` -> `.pt2`) through `torch.export.load`.

The program is an ATen graph run by torch's own kernels, like eager; data-dependent branches are kept as
`torch.cond` and the batch (and, when the model resizes in its graph, height and width) as symbolic
dimensions, checked on every call by the program's own guards.
"""

from __future__ import annotations

import torch

from runtime.torch_ops import with_torchvision_ops
from runtime.torchscript import TorchModuleBackend


class ExportedProgramBackend(TorchModuleBackend):
    format = "torch-export"

    def load(self, path: str, device: torch.device) -> torch.nn.Module:
        with_torchvision_ops(path)  # a detector's nms: registered before its graph is read
        return torch.export.load(path).module().to(device)  # a GraphModule: eval()/train() are not allowed on it
