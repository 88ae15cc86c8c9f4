"""The builders of the 16-bit variants (each `build(context, kind, source)`, export.precision.builder):

  run_in_precision  scripted-bf16, scripted-fp16, openvino-bf16: the fp32 source's own file run in another
                    precision (torch.autocast around the scripted module; OpenVINO's inference precision hint),
                    no new file; openvino-int8-bf16: the openvino-int8 IR (the variant it needs) under the bf16
                    hint, its layers left in floating point run in bf16 (no second quantization)
  onnx_fp16         onnx-fp16: the fp32 ONNX converted to float16 (inputs and outputs stay float32) for ONNX
                    Runtime's CUDA provider
"""

from __future__ import annotations

from export.precision.builder import Variant, VariantContext
from export.precision.request import PrecisionError
from runtime import RunOptions, open_artifact


def run_in_precision(context: VariantContext, kind, source) -> Variant:
    """A file already made run in the kind's run precision: a new way to run it, gated like a new file. The file
    is the fp32 source's, or that of the variant the kind needs (the int8 IR whose remainder runs in bf16)."""
    path, made_from = _file_to_run(context, kind, source)
    backend = open_artifact(kind.format, path, RunOptions(device=context.device, precision=kind.run_precision),
                            name=f"{kind.name} candidate")
    gate = context.held_out.gate(kind, backend)
    made_by = {"tool": f"{kind.exporter} ({path.name})", "device": context.device, "ran_in": gate.ran_in,
               **made_from, **_remainder(kind, backend)}
    return Variant(kind=kind.name, path=path, format=kind.format, precision=kind.precision,
                   run_precision=kind.run_precision, source=source.kind, made_by=made_by, gate=gate,
                   images_per_s=context.held_out.speed(backend))


def _file_to_run(context: VariantContext, kind, source):
    """The file the kind runs, and what made it when it is not the fp32 source's (a variant's, as it was gated)."""
    if not kind.needs:
        return source.path, {}
    variant = context.made.get(kind.needs[0])
    if variant is None:
        raise PrecisionError(f"{kind.name} runs the {kind.needs[0]} file, which was not made (its own line says "
                             "why)")
    return variant.path, {"file_of": variant.kind, "file_made_by": variant.made_by["tool"],
                          "file_gate": variant.gate.verdict if variant.gate else None}


def _remainder(kind, backend) -> dict:
    """For an int8 file run in another precision: what its layers left in floating point ran in, read back from
    the runtime (OpenVINO runs a bf16 hint as f32 on a CPU without native bf16)."""
    if not kind.runs_beyond_its_precision:
        return {}
    return {"remainder_ran_in": backend.describe().get("actual_precision", kind.run_precision)}


def onnx_fp16(context: VariantContext, kind, source) -> Variant:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16
    path = context.stage / kind.file_name
    onnx.save(convert_float_to_float16(onnx.load(str(source.path)), keep_io_types=True), str(path))
    backend = open_artifact(kind.format, path, RunOptions(device=context.device))
    made_by = {"tool": "onnxruntime.transformers.float16.convert_float_to_float16", "keep_io_types": True,
               "runs_on": "ONNX Runtime CUDAExecutionProvider"}
    return Variant(kind=kind.name, path=path, format=kind.format, precision=kind.precision,
                   run_precision=kind.run_precision, source=source.kind, made_by=made_by,
                   gate=context.held_out.gate(kind, backend), images_per_s=context.held_out.speed(backend))
