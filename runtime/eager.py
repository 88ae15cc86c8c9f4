"""An in-memory nn.Module behind the same interface: the reference that parity compares against."""

from __future__ import annotations

import torch
from torch import nn

from runtime.base import Backend, Outputs, RunOptions, host_outputs
from runtime.torchscript import autocast_settings, configure_torch


class EagerBackend(Backend):
    format = "eager"
    supported_precisions = ("fp32", "fp16", "bf16")

    def __init__(self, module: nn.Module, options: RunOptions | None = None, name: str = "eager"):
        options = options or RunOptions()
        super().__init__(None, options, name)
        configure_torch(options)
        self.device = options.torch_device
        self.module = module.to(self.device).eval()
        self.autocast = autocast_settings(options)

    def predict(self, batch: torch.Tensor) -> Outputs:
        with torch.inference_mode(), torch.autocast(**self.autocast):
            return host_outputs(self.module(batch.to(self.device)))
