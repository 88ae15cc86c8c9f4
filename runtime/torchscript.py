"""TorchScript artifacts (traced or scripted) through torch.jit.load."""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path
from typing import Any

import torch

from runtime.base import Backend, Outputs, RunOptions, host_outputs
from runtime.torch_ops import with_torchvision_ops


class TorchModuleBackend(Backend):
    """A torch module loaded from a file: the batch moved to its device, run under autocast for the run-time
    precision. Subclasses say how their file loads (`load`)."""

    supported_precisions = ("fp32", "fp16", "bf16")

    def __init__(self, path: Path, options: RunOptions, name: str | None = None):
        super().__init__(path, options, name)
        self.device = options.torch_device
        configure_torch(options)
        self.module = self.load(str(path), self.device)
        self.autocast = autocast_settings(options)

    @abstractmethod
    def load(self, path: str, device: torch.device) -> torch.nn.Module:
        """The module in eval mode on `device`."""

    def predict(self, batch: torch.Tensor) -> Outputs:
        with torch.inference_mode(), torch.autocast(**self.autocast):
            return host_outputs(self.module(batch.to(self.device, non_blocking=True)))


class TorchScriptBackend(TorchModuleBackend):
    format = "torchscript"

    def load(self, path: str, device: torch.device) -> torch.nn.Module:
        with_torchvision_ops(path)  # a detector's nms: registered before the code that calls it is loaded
        module: torch.jit.ScriptModule = torch.jit.load(path, map_location=device)  # torch.jit.load is unannotated
        return module.eval()


def configure_torch(options: RunOptions) -> None:
    """Process-wide torch settings for a run: CPU threads, cuDNN autotuning on GPUs."""
    if options.threads:
        torch.set_num_threads(options.threads)  # process-wide: one TorchServe worker serves one model
    if options.torch_device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed-size batches: let cuDNN pick its fastest kernels


def autocast_settings(options: RunOptions) -> dict[str, Any]:
    """torch.autocast keyword arguments for the run-time precision (disabled for fp32)."""
    device_type = options.torch_device.type
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(options.precision)
    return {"device_type": device_type, "dtype": dtype or torch.float32, "enabled": dtype is not None}
