"""Device choice and the two serving backends: TorchScript (torch.jit.load) and ONNX Runtime."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from export.runtime import CUDA_PROVIDER, ort_session

logger = logging.getLogger(__name__)


def select_device(system_properties: dict, cuda_available: Callable[[], bool] | None = None) -> torch.device:
    """cuda:{gpu_id} when TorchServe assigned a GPU and CUDA works here; CPU otherwise."""
    gpu_id = system_properties.get("gpu_id")
    if gpu_id is not None and (cuda_available or torch.cuda.is_available)():
        return torch.device(f"cuda:{int(gpu_id)}")
    return torch.device("cpu")


def threads_per_worker(workers: int, cores: int | None = None) -> int:
    """Keep workers x threads <= cores: TorchServe's defaults oversubscribe and throughput collapses."""
    cores = cores or os.cpu_count() or 1
    return max(1, cores // max(1, workers))


class TorchScriptBackend:
    def __init__(self, path: Path, device: torch.device, fp16: bool = False):
        self.device = device
        self.fp16 = fp16 and device.type == "cuda"
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed 224x224 batches: let cuDNN pick its fastest kernels
        self.module = torch.jit.load(str(path), map_location=device).eval()

    def predict(self, batch: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16, enabled=self.fp16):
            return self.module(batch.to(self.device, non_blocking=True)).float().cpu()


class OnnxBackend:
    def __init__(self, path: Path, device: torch.device, threads: int = 0):
        self.session = ort_session(path, device, intra_op_threads=threads)
        self.input_name = self.session.get_inputs()[0].name
        if device.type == "cuda" and CUDA_PROVIDER not in self.session.get_providers():
            logger.warning("ONNX Runtime has no CUDA provider here (install onnxruntime-gpu): running on CPU")

    def predict(self, batch: torch.Tensor) -> torch.Tensor:
        output = self.session.run(None, {self.input_name: np.ascontiguousarray(batch.numpy())})[0]
        return torch.from_numpy(output)


def open_backend(record: dict, model_dir: Path, device: torch.device, fp16: bool, threads: int):
    """The backend for one manifest artifact record, loaded from the archive's folder."""
    path = model_dir / record["path"]
    if not path.is_file():
        raise FileNotFoundError(f"the archive does not contain {record['path']} (named by the manifest)")
    if record["format"] == "torchscript":
        return TorchScriptBackend(path, device, fp16)
    if record["format"] == "onnx":
        return OnnxBackend(path, device, threads)
    raise ValueError(f"unknown artifact format {record['format']!r}")
