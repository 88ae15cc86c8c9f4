"""torch.export's ExportedProgram (`torch.export.save` -> `.pt2`) through `torch.export.load`.

The program is an ATen graph run by torch's own kernels, like eager; data-dependent branches are kept as
`torch.cond` and the batch (and, when the model resizes in its graph, height and width) as symbolic
dimensions, checked on every call by the program's own guards.
"""

from __future__ import annotations

import torch

from runtime.base import Backend, RunOptions
from runtime.torchscript import autocast_settings, configure_torch


class ExportedProgramBackend(Backend):
    format = "torch-export"
    supported_precisions = ("fp32", "fp16", "bf16")

    def __init__(self, path, options: RunOptions, name: str | None = None):
        super().__init__(path, options, name)
        self.device = options.torch_device
        configure_torch(options)
        program = torch.export.load(str(path))
        self.module = program.module().to(self.device)  # a GraphModule: eval()/train() are not allowed on it
        self.autocast = autocast_settings(options)

    def predict(self, batch: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(), torch.autocast(**self.autocast):
            return self.module(batch.to(self.device, non_blocking=True)).float().cpu()
