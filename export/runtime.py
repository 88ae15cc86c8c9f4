"""Load and run artifacts: one ONNX Runtime session factory and small runners per backend.

Everything that opens an artifact (parity, the trace-vs-script report, the TorchServe handler) goes
through here, so session options and provider choice live in one place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

# ORT_ENABLE_ALL fuses Conv+BN and reorders layouts; parity tolerances are chosen for it.
ORT_GRAPH_OPTIMIZATION = "ORT_ENABLE_ALL"
CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"


def cuda_device_index(device: str | torch.device) -> int | None:
    device = torch.device(device)
    return (device.index or 0) if device.type == "cuda" else None


def ort_providers(device: str | torch.device, available: list[str] | None = None) -> list:
    """CUDA provider on the requested GPU when ORT has it, CPU always as the fallback."""
    import onnxruntime as ort
    available = ort.get_available_providers() if available is None else available
    index = cuda_device_index(device)
    if index is not None and CUDA_PROVIDER in available:
        return [(CUDA_PROVIDER, {"device_id": index}), CPU_PROVIDER]
    return [CPU_PROVIDER]


def ort_session(path: str | os.PathLike, device: str | torch.device = "cpu", intra_op_threads: int = 0):
    """An InferenceSession with our options. intra_op_threads=0 lets ORT use every core."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, ORT_GRAPH_OPTIMIZATION)
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only: ORT's warnings about unused initializers are noise here
    return ort.InferenceSession(str(path), sess_options=options, providers=ort_providers(device))


@dataclass
class Runner:
    """Callable artifact: float tensor in, float tensor out (on CPU, for comparison)."""

    name: str
    run: Callable[[torch.Tensor], torch.Tensor]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(x)


def eager_runner(module: torch.nn.Module) -> Runner:
    def run(x):
        with torch.inference_mode():
            return module(x).float().cpu()
    return Runner("eager", run)


def torchscript_runner(path: Path, device: str = "cpu", name: str | None = None) -> Runner:
    module = torch.jit.load(str(path), map_location=device).eval()

    def run(x):
        with torch.inference_mode():
            return module(x.to(device)).float().cpu()
    return Runner(name or Path(path).name, run)


def onnx_runner(path: Path, device: str = "cpu", name: str | None = None, intra_op_threads: int = 0) -> Runner:
    session = ort_session(path, device, intra_op_threads)
    input_name = session.get_inputs()[0].name

    def run(x):
        output = session.run(None, {input_name: np.ascontiguousarray(x.detach().cpu().numpy())})[0]
        return torch.from_numpy(output)
    return Runner(name or Path(path).name, run)


def reference_runner(path: Path, name: str | None = None) -> Runner:
    """onnx.reference.ReferenceEvaluator: slow, written from the spec; a second opinion for small models."""
    from onnx.reference import ReferenceEvaluator
    evaluator = ReferenceEvaluator(str(path))
    input_name = evaluator.input_names[0]

    def run(x):
        return torch.from_numpy(np.asarray(evaluator.run(None, {input_name: x.numpy()})[0]))
    return Runner(name or f"reference:{Path(path).name}", run)


def artifact_runner(format: str, path: Path, device: str = "cpu", name: str | None = None) -> Runner:
    if format == "torchscript":
        return torchscript_runner(path, device, name)
    if format == "onnx":
        return onnx_runner(path, device, name)
    raise ValueError(f"unknown artifact format {format!r}")
