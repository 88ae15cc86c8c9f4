"""The builders of the 16-bit variants (each `build(context, kind, source)`, export.precision.builder):

  run_in_precision  scripted-bf16, scripted-fp16, openvino-bf16: the fp32 source's own file run in another
                    precision (torch.autocast around the scripted module; OpenVINO's inference precision hint),
                    no new file
  onnx_fp16         onnx-fp16: the fp32 ONNX converted to float16 (inputs and outputs stay float32) for ONNX
                    Runtime's CUDA provider
"""

from __future__ import annotations

from export.forms import kinds
from export.precision.builder import Variant, VariantContext
from runtime import RunOptions, open_artifact


def run_in_precision(context: VariantContext, kind, source) -> Variant:
    """An fp32 file run in the kind's precision: a new way to run it, gated like a new file."""
    backend = open_artifact(source.format, source.path, RunOptions(device=context.device, precision=kind.precision))
    gate = context.held_out.gate(kind, backend)
    made_by = {"tool": f"{kind.exporter} ({source.path.name})", "device": context.device, "ran_in": gate.ran_in}
    return Variant(kind=kind.name, path=source.path, format=source.format, precision=kind.precision,
                   run_precision=kind.precision, source=source.kind, made_by=made_by, gate=gate,
                   images_per_s=context.held_out.speed(backend))


def onnx_fp16(context: VariantContext, kind, source) -> Variant:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16
    path = context.stage / kind.file_name
    onnx.save(convert_float_to_float16(onnx.load(str(source.path)), keep_io_types=True), str(path))
    backend = open_artifact(kind.format, path, RunOptions(device=context.device))
    made_by = {"tool": "onnxruntime.transformers.float16.convert_float_to_float16", "keep_io_types": True,
               "runs_on": "ONNX Runtime CUDAExecutionProvider"}
    return Variant(kind=kind.name, path=path, format=kind.format, precision=kind.precision,
                   run_precision=kinds.FP32, source=source.kind, made_by=made_by,
                   gate=context.held_out.gate(kind, backend), images_per_s=context.held_out.speed(backend))
