"""ONNX artifacts through ONNX Runtime: one place for session options and provider choice."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from runtime.base import ArtifactError, Backend, Outputs, RunOptions, host_outputs

logger = logging.getLogger(__name__)

# ORT_ENABLE_ALL fuses Conv+BN and reorders layouts; parity tolerances are chosen for it.
GRAPH_OPTIMIZATION = "ORT_ENABLE_ALL"
CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"


def missing_cuda_provider(available: list[str]) -> str | None:
    """Why ONNX Runtime cannot run on a GPU with these providers, or None."""
    if CUDA_PROVIDER in available:
        return None
    return f"ONNX Runtime here has no {CUDA_PROVIDER} (providers: {', '.join(available)}); install onnxruntime-gpu"


def providers_for(device: torch.device, available: list[str]) -> list[str | tuple[str, dict[str, int]]]:
    """The CUDA provider on the requested GPU, CPU as the fallback for ops CUDA lacks."""
    if device.type == "cuda":
        missing = missing_cuda_provider(available)
        if missing:
            raise ArtifactError(f"{missing}, or run on cpu")
        return [(CUDA_PROVIDER, {"device_id": device.index or 0}), CPU_PROVIDER]
    return [CPU_PROVIDER]


def check_session_providers(device: torch.device, actual: list[str]) -> None:
    """ONNX Runtime drops the CUDA provider with only a log line when CUDA or cuDNN libraries fail to load, and
    then runs everything on the CPU: a GPU asked for must be a GPU got."""
    if device.type == "cuda" and CUDA_PROVIDER not in actual:
        raise ArtifactError(f"ONNX Runtime could not start {CUDA_PROVIDER} (the session has only "
                            f"{', '.join(actual)}): CUDA or cuDNN libraries matching onnxruntime-gpu are missing "
                            "or do not load; check `python -c \"import onnxruntime as o; o.preload_dlls()\"`, "
                            "or run on cpu")


def session_options(threads: int) -> Any:  # onnxruntime.SessionOptions (onnxruntime ships no types)
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, GRAPH_OPTIMIZATION)
    options.intra_op_num_threads = threads  # 0: every core
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only: warnings about unused initializers are noise here
    if os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE":
        # ORT's own thread pool ignores OpenMP's setting; asked to wait passively, its threads stop spinning too
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


class OnnxRuntimeBackend(Backend):
    format = "onnx"

    @classmethod
    def unavailable(cls, device: str) -> str | None:
        if not device.startswith("cuda"):
            return None
        import onnxruntime as ort
        return missing_cuda_provider(ort.get_available_providers())

    def __init__(self, path: Path, options: RunOptions, name: str | None = None):
        super().__init__(path, options, name)
        import onnxruntime as ort
        providers = providers_for(options.torch_device, ort.get_available_providers())
        self.session = ort.InferenceSession(str(path), sess_options=session_options(options.threads),
                                            providers=providers)
        check_session_providers(options.torch_device, self.session.get_providers())
        self.input_name = self.session.get_inputs()[0].name

    def predict(self, batch: torch.Tensor) -> Outputs:
        array = np.ascontiguousarray(batch.detach().cpu().numpy())
        return host_outputs([torch.from_numpy(o) for o in self.session.run(None, {self.input_name: array})])

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "providers": self.session.get_providers()}
