"""One function per artifact format: each takes a module and an example input and writes one file.

Artifact kinds, in the order they are produced:
  traced         torch.jit.trace      - records the one path the example took
  scripted       torch.jit.script     - compiles Python control flow (prim::If / prim::Loop)
  onnx-traced    torch.onnx.export(dynamo=False) of the traced module
  onnx-scripted  torch.onnx.export(dynamo=False) of the scripted module (keeps If / Loop)
  onnx-dynamo    torch.onnx.export(dynamo=True), torch.export-based (torch.cond / torch.while_loop forms)
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from export.atomic import atomic_write_bytes

DEFAULT_OPSET = 18  # the torch.export-based exporter's floor; ONNX Runtime 1.2x runs it everywhere
INPUT_NAME = "input"
OUTPUT_NAME = "output"
BATCH_DIM = "batch"

FILE_NAMES = {
    "traced": "model.traced.pt",
    "scripted": "model.scripted.pt",
    "onnx-traced": "model.traced.onnx",
    "onnx-scripted": "model.scripted.onnx",
    "onnx-dynamo": "model.dynamo.onnx",
}
EXPORTERS = {
    "traced": "torch.jit.trace",
    "scripted": "torch.jit.script",
    "onnx-traced": "torch.onnx.export(dynamo=False) of the traced module",
    "onnx-scripted": "torch.onnx.export(dynamo=False) of the scripted module",
    "onnx-dynamo": "torch.onnx.export(dynamo=True) (torch.export)",
}


@dataclass
class Artifact:
    kind: str
    path: Path
    format: str  # torchscript | onnx
    exporter: str
    spatial_dynamic: bool  # accepts other H x W (resized in the graph)
    control_flow: dict = field(default_factory=dict)
    checks: dict = field(default_factory=dict)

    def accepts(self, example_shape) -> str:
        if self.spatial_dynamic:
            return "any batch; any height x width (resized in the graph)"
        return f"any batch; exactly {' x '.join(str(d) for d in example_shape[1:])}"


def trace(module: nn.Module, example: torch.Tensor, folder: Path) -> tuple[torch.jit.ScriptModule, Artifact]:
    with torch.no_grad():  # the tracer rejects inference-mode tensors
        traced = torch.jit.trace(module, example, check_trace=False)
    return traced, _save_torchscript(traced, "traced", folder, spatial_dynamic=False)


def script(module: nn.Module, folder: Path, spatial_dynamic: bool) -> tuple[torch.jit.ScriptModule, Artifact]:
    scripted = torch.jit.script(module)
    return scripted, _save_torchscript(scripted, "scripted", folder, spatial_dynamic)


def _save_torchscript(module, kind: str, folder: Path, spatial_dynamic: bool) -> Artifact:
    path = folder / FILE_NAMES[kind]
    # Serialise in memory, write from Python: torch's own file writer aborts the process on a full disk.
    buffer = io.BytesIO()
    torch.jit.save(module, buffer)
    atomic_write_bytes(path, buffer.getvalue())
    return Artifact(kind, path, "torchscript", EXPORTERS[kind], spatial_dynamic)


def onnx_legacy(script_module, kind: str, example: torch.Tensor, folder: Path, opset: int,
                spatial_dynamic: bool) -> Artifact:
    """The TorchScript-based exporter: the only one that takes a ScriptModule and keeps its If/Loop."""
    path = folder / FILE_NAMES[kind]
    axes = {0: BATCH_DIM, 2: "height", 3: "width"} if spatial_dynamic else {0: BATCH_DIM}
    with torch.no_grad():
        torch.onnx.export(script_module, (example,), str(path), dynamo=False, opset_version=opset,
                          input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                          dynamic_axes={INPUT_NAME: axes, OUTPUT_NAME: {0: BATCH_DIM}})
    return Artifact(kind, path, "onnx", EXPORTERS[kind], spatial_dynamic)


def torch_export_form(module: nn.Module) -> nn.Module:
    """What torch.export sees: modules with data-dependent branches offer `torch_export_form()`
    (torch.cond / torch.while_loop spelling); the pipeline puts it in eval mode and verifies it."""
    return module.torch_export_form() if hasattr(module, "torch_export_form") else module


def onnx_dynamo(form: nn.Module, example: torch.Tensor, folder: Path, opset: int,
                spatial_dynamic: bool) -> Artifact:
    """torch.export-based exporter, given the module's torch.export form (see torch_export_form)."""
    path = folder / FILE_NAMES["onnx-dynamo"]
    dims = {0: torch.export.Dim(BATCH_DIM, min=1, max=4096)}
    if spatial_dynamic:
        dims.update({2: torch.export.Dim("height", min=32, max=4096), 3: torch.export.Dim("width", min=32, max=4096)})
    argument = next(iter(_forward_argument_names(form)), "x")
    program = torch.onnx.export(form, (example,), dynamo=True, opset_version=opset, external_data=False,
                                input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                                dynamic_shapes={argument: dims})
    program.save(str(path), external_data=False)
    return Artifact("onnx-dynamo", path, "onnx", EXPORTERS["onnx-dynamo"], spatial_dynamic)


def estimated_bytes(module: nn.Module) -> int:
    """Disk an export needs: five artifacts, each about the size of the parameters and buffers."""
    tensors = list(module.parameters()) + list(module.buffers())
    return len(FILE_NAMES) * sum(t.numel() * t.element_size() for t in tensors)


def _forward_argument_names(module: nn.Module) -> list[str]:
    import inspect
    return [p for p in inspect.signature(module.forward).parameters if p != "self"]
