"""Exporter functions: each builds one artifact kind (a row of export.forms.kinds) from a BuildContext.

  trace                  torch.jit.trace      - records the one path the example took
  script                 torch.jit.script     - compiles Python control flow (prim::If / prim::Loop)
  onnx_from_torchscript  torch.onnx.export(dynamo=False) of the traced or scripted module (keeps If / Loop)
  onnx_dynamo            torch.onnx.export(dynamo=True) of the torch.export program (torch.cond / torch.while_loop)
torch.export's own artifacts (ExportedProgram, AOTInductor) are made in export.forms.torch_export.
"""

from __future__ import annotations

import copy
import inspect
import io
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from contract.files import atomic_write_bytes
from contract.records import INPUT_NAME, OUTPUT_NAME

DEFAULT_OPSET = 18  # the torch.export-based exporter's floor; ONNX Runtime 1.2x runs it everywhere
BATCH_DIM = "batch"
DETECTIONS_DIM = "detections"  # a detector's outputs: one row per box found
MAX_DIM = 4096  # largest batch and side the torch.export-based exporter is told to expect
EXPORT_BATCH = 2  # torch.export specialises a dimension of size 1; its example has at least this many rows


@dataclass
class Artifact:
    kind: str
    path: Path
    format: str
    exporter: str
    spatial_dynamic: bool  # accepts other H x W (resized in the graph)
    loaded: object | None = None  # the in-memory module, for kinds built from it and the control-flow census
    control_flow: dict = field(default_factory=dict)
    checks: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)  # kind-specific facts for the manifest (the build a package needs)

    def accepts(self, example_shape) -> str:
        if self.spatial_dynamic:
            return "any batch; any height x width (resized in the graph)"
        return f"any batch; exactly {' x '.join(str(d) for d in example_shape[1:])}"


@dataclass(frozen=True)
class GraphIO:
    """The names and dynamic dimensions an exported graph gets: a batch of images in and one output (a classifier,
    a segmenter), or one image in and a detector's outputs, each as long as the detections it found."""

    outputs: tuple[str, ...] = (OUTPUT_NAME,)
    dynamic_batch: bool = True
    any_size: bool = False  # a whole-image model (a detector, a segmenter): every form takes any height x width

    def input_axes(self, spatial_dynamic: bool) -> dict[int, str]:
        axes = {0: BATCH_DIM} if self.dynamic_batch else {}
        return {**axes, 2: "height", 3: "width"} if spatial_dynamic else axes

    def output_axes(self) -> dict[str, dict[int, str]]:
        return {name: {0: BATCH_DIM if self.dynamic_batch else DETECTIONS_DIM} for name in self.outputs}


@dataclass
class BuildContext:
    """What every exporter function may use: the verified module, its torch.export form, the example input,
    the staging folder, the export's device, and the artifacts built so far (kind -> Artifact)."""

    module: nn.Module
    export_form: nn.Module | BaseException  # the error when the torch.export form failed its eval check
    example: torch.Tensor
    folder: Path
    opset: int
    resizes_in_graph: bool
    device: str = "cpu"
    io: GraphIO = field(default_factory=GraphIO)
    built: dict = field(default_factory=dict)
    programs: dict = field(default_factory=dict)  # (spatial_dynamic, device) -> ExportedProgram, made once
    image: object | None = None  # the model's ImageContract and labels: a device program's input contract names them
    labels: list[str] | None = None

    def program(self, spatial_dynamic: bool, device: str = "cpu") -> torch.export.ExportedProgram:
        """torch.export of the module's torch.export form, with a dynamic batch (and height and width when
        spatial_dynamic), exported once and shared by the kinds made from it."""
        if isinstance(self.export_form, BaseException):  # it failed its eval check: only these forms are refused
            raise self.export_form
        key = (spatial_dynamic, device)
        if key not in self.programs:
            try:
                self.programs[key] = export_program(self.export_form, self.example, spatial_dynamic, device,
                                                    self.io.dynamic_batch)
            except Exception as error:  # noqa: BLE001 - kept: every kind made from it is refused with it
                self.programs[key] = error
        if isinstance(self.programs[key], BaseException):
            raise self.programs[key]
        return self.programs[key]

    def artifact(self, kind, loaded=None, source_dynamic: bool = False) -> Artifact:
        """A whole-image model's every form claims any size (torchvision's detectors are written to be traced
        at any size); trace vs script's probes of other sizes then show the forms that are wrong there."""
        dynamic = self.io.any_size or kind.spatial_dynamic(self.resizes_in_graph, source_dynamic)
        return Artifact(kind.name, self.folder / kind.file_name, kind.format, kind.exporter, dynamic, loaded)


def trace(context: BuildContext, kind) -> Artifact:
    with torch.no_grad():  # the tracer rejects inference-mode tensors
        traced = torch.jit.trace(context.module, context.example, check_trace=False)
    return _save_torchscript(context, kind, traced)


def script(context: BuildContext, kind) -> Artifact:
    return _save_torchscript(context, kind, torch.jit.script(context.module))


def _save_torchscript(context: BuildContext, kind, module) -> Artifact:
    artifact = context.artifact(kind, loaded=module)
    # Serialise in memory, write from Python: torch's own file writer aborts the process on a full disk.
    buffer = io.BytesIO()
    torch.jit.save(module, buffer)
    atomic_write_bytes(artifact.path, buffer.getvalue())
    return artifact


def onnx_from_torchscript(context: BuildContext, kind) -> Artifact:
    """The TorchScript-based exporter, from the kind's `needs[0]`: the only exporter that takes a ScriptModule
    and keeps its If/Loop."""
    source = context.built[kind.needs[0]]
    artifact = context.artifact(kind, source_dynamic=source.spatial_dynamic)
    with torch.no_grad():
        torch.onnx.export(source.loaded, (context.example,), str(artifact.path), dynamo=False,
                          opset_version=context.opset, input_names=[INPUT_NAME], output_names=list(context.io.outputs),
                          dynamic_axes={INPUT_NAME: context.io.input_axes(artifact.spatial_dynamic),
                                        **context.io.output_axes()})
    return artifact


def torch_export_form(module: nn.Module) -> nn.Module:
    """What torch.export sees: modules with data-dependent branches offer `torch_export_form()`
    (torch.cond / torch.while_loop spelling); the pipeline puts it in eval mode and verifies it."""
    return module.torch_export_form() if hasattr(module, "torch_export_form") else module


def onnx_dynamo(context: BuildContext, kind) -> Artifact:
    """torch.export-based ONNX exporter, from the program shared with the torch.export kinds (see
    BuildContext.program)."""
    artifact = context.artifact(kind)
    program = torch.onnx.export(context.program(artifact.spatial_dynamic), dynamo=True, opset_version=context.opset,
                                external_data=False, input_names=[INPUT_NAME], output_names=list(context.io.outputs),
                                dynamic_shapes=(dynamic_dims(artifact.spatial_dynamic, context.io.dynamic_batch),))
    program.save(str(artifact.path), external_data=False)
    return artifact


def export_program(form: nn.Module, example: torch.Tensor, spatial_dynamic: bool, device: str = "cpu",
                   dynamic_batch: bool = True) -> torch.export.ExportedProgram:
    """torch.export of the module's torch.export form (see torch_export_form). The batch is a dynamic
    dimension, exported from an example of at least EXPORT_BATCH rows: from a batch of 1, torch.export
    specialises the batch to 1 in any model that reshapes with it (x.reshape(b, ...), flatten + attention) and
    refuses the dynamic batch ("specialized it to be a constant (1)")."""
    if device != "cpu":
        form = copy.deepcopy(form).to(device)
    argument = next(iter(_forward_argument_names(form)), "x")
    example = export_example(example) if dynamic_batch else example
    return torch.export.export(form, (example.to(device),),
                               dynamic_shapes={argument: dynamic_dims(spatial_dynamic, dynamic_batch)})


def dynamic_dims(spatial_dynamic: bool, dynamic_batch: bool = True) -> dict:
    """The input's dynamic dimensions, named as the ONNX files name them: the batch (unless the model takes one
    image), and height and width when the model resizes in its graph."""
    dims = {0: torch.export.Dim(BATCH_DIM, min=1, max=MAX_DIM)} if dynamic_batch else {}
    if spatial_dynamic:
        dims.update({2: torch.export.Dim("height", min=32, max=MAX_DIM),
                     3: torch.export.Dim("width", min=32, max=MAX_DIM)})
    return dims


def export_example(example: torch.Tensor) -> torch.Tensor:
    """The example repeated to EXPORT_BATCH rows when it has fewer (see onnx_dynamo)."""
    if example.shape[0] >= EXPORT_BATCH:
        return example
    return example.repeat(EXPORT_BATCH, *([1] * (example.dim() - 1)))[:EXPORT_BATCH]


def parameter_bytes(module: nn.Module) -> int:
    tensors = list(module.parameters()) + list(module.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def _forward_argument_names(module: nn.Module) -> list[str]:
    return [p for p in inspect.signature(module.forward).parameters if p != "self"]
