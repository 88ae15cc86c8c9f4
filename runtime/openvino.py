"""OpenVINO IR artifacts (model.xml with its weights model.bin beside it) on OpenVINO's CPU plugin.

The inference precision is always set: without it OpenVINO runs an fp32 IR in bf16 on CPUs with AVX512_BF16 or
AMX, which would break fp32 parity. On a CPU without native bf16 a bf16 hint is silently run in f32 (measured on
an AVX2 EPYC), so describe() reports the precision the compiled model actually runs in, read back from it. The hint
is the precision of the floating-point layers: an int8 IR's quantized layers run in int8 whatever it says, and under
bf16 the layers NNCF left in floating point run in bf16 (openvino-int8-bf16).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from runtime.base import ArtifactError, Backend, Outputs, RunOptions, host_outputs
from runtime.signal_stack import keep_signal_stack

DEVICE = "CPU"  # OpenVINO's GPU plugin is for Intel GPUs; a CUDA machine serves other forms
PERFORMANCE_HINT = "LATENCY"  # one request per serving worker: no throughput streams
# OpenVINO pins its inference threads to cores it picks within its own process, so the serving policy's workers
# (one single-threaded process per core) all ran on the first core: two ResNet-50 int8 workers on a 2-core Zen 5
# made 39 images/s each pinned, 75 each unpinned (76.5 alone). The OS places each worker's thread instead.
CPU_PINNING = False
PRECISION_HINTS = {"fp32": "f32", "bf16": "bf16"}  # RunOptions.precision -> INFERENCE_PRECISION_HINT
OUR_PRECISION = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}  # OpenVINO's element type names -> ours
INSTALL = "pip install '.[openvino]'"


def import_openvino() -> ModuleType:
    """openvino, or an ArtifactError saying how to install it (only OpenVINO artifacts need it)."""
    try:
        return importlib.import_module("openvino")
    except ImportError as error:
        raise ArtifactError(f"OpenVINO artifacts need the openvino package ({error}); {INSTALL}") from None


def compile_config(options: RunOptions) -> dict[str, str | bool | int]:
    config: dict[str, str | bool | int] = {"INFERENCE_PRECISION_HINT": PRECISION_HINTS[options.precision],
                                           "PERFORMANCE_HINT": PERFORMANCE_HINT, "ENABLE_CPU_PINNING": CPU_PINNING}
    if options.threads:  # 0: OpenVINO's default (every core)
        config["INFERENCE_NUM_THREADS"] = options.threads
    return config


def companion_weights(xml_name: str) -> str:
    """The weights file OpenVINO reads beside an IR: model.openvino.xml -> model.openvino.bin."""
    return xml_name[:-len(".xml")] + ".bin" if xml_name.endswith(".xml") else xml_name + ".bin"


class OpenVinoBackend(Backend):
    format = "openvino"
    supported_precisions = ("fp32", "bf16")

    def __init__(self, path: Path, options: RunOptions, name: str | None = None):
        if options.torch_device.type != "cpu":
            raise ArtifactError(f"OpenVINO artifacts run on the CPU here (its GPU plugin is for Intel GPUs), not "
                                f"{options.device}; serve another form on a CUDA machine")
        super().__init__(path, options, name)
        weights = path.with_name(companion_weights(path.name))
        if not weights.is_file():
            raise ArtifactError(f"{path.name}'s weights {weights.name} are missing beside it; re-run the export")
        openvino = import_openvino()
        self.version = openvino.get_version()
        self.compiled = openvino.Core().compile_model(str(path), DEVICE, compile_config(options))
        keep_signal_stack()  # the plugin's own dies with this model, maybe while the thread is still on it
        self.request = self.compiled.create_infer_request()  # one per backend: a worker calls it one batch at a time

    def predict(self, batch: torch.Tensor) -> Outputs:
        array = np.ascontiguousarray(batch.detach().cpu().numpy(), dtype=np.float32)
        results = self.request.infer({0: array})  # copied out of the request (share_outputs=False)
        return host_outputs([torch.from_numpy(np.asarray(results[i])) for i in range(len(results))])

    def actual_precision(self) -> str:
        """What the compiled model computes in (a bf16 hint runs as f32 on a CPU without native bf16)."""
        element: str = self.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        return OUR_PRECISION.get(element, element)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "actual_precision": self.actual_precision(), "openvino": self.version,
                "threads_used": self.compiled.get_property("INFERENCE_NUM_THREADS"),
                "cpu_pinning": self.compiled.get_property("ENABLE_CPU_PINNING")}
