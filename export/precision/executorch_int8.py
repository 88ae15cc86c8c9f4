"""executorch-int8: PT2E post-training int8 of the device program, lowered to XNNPACK, gated like every int8 form
(a builder of export.precision.builder).

The fp32 program's graph (export.forms.executorch.device_program) is prepared with torchao's PT2E flow and
ExecuTorch's XNNPACKQuantizer (symmetric int8, weights per channel: XNNPACK's int8 kernels), observed on the same
calibration images as onnx-int8 and openvino-int8, converted, exported again with the same batch range and
lowered as the fp32 program is. What is gated on the held-out images is the written `.pte`, run by ExecuTorch's
runtime: what ships is what was judged. No fallback to fp32 layers: a program that fails the gate is refused with
its numbers, as --gate says.
"""

from __future__ import annotations

import json
import time

import torch

from contract.files import atomic_write_bytes
from export.errors import ExportError
from export.forms.executorch import MAX_BATCH, lower_program, save_contract
from export.forms.exporters import BATCH_DIM
from export.precision.builder import Variant, VariantContext
from runtime import RunOptions, open_artifact
from runtime.executorch import INSTALL, contract_name

QUANTIZER = {"quantizer": "XNNPACKQuantizer", "config": "get_symmetric_quantization_config(is_per_channel=True)"}


def build_executorch_int8(context: VariantContext, kind, source) -> Variant:
    """The int8 program in the stage with its contract beside it, gated on the held-out images."""
    program = source.loaded
    if not isinstance(program, torch.export.ExportedProgram):
        raise ExportError(f"{kind.name} is made from {source.kind}'s program, which this export did not keep")
    started = time.perf_counter()
    quantized = quantize(program, context.calibration.images)
    timings = {"quantize_s": round(time.perf_counter() - started, 2)}
    started = time.perf_counter()
    lowered = lower_program(reexport(quantized, program, context.calibration.images))
    timings["lower_s"] = round(time.perf_counter() - started, 2)
    path = context.stage / kind.file_name
    atomic_write_bytes(path, lowered.program)
    contract = json.loads(source.path.with_name(contract_name(source.path.name)).read_text())
    contract = save_contract(path, {**contract, "precision": kind.precision}, lowered,
                             context.calibration.images[:1])
    backend = open_artifact(kind.format, path, RunOptions(), name=f"{kind.name} candidate")
    gate = context.held_out.gate(kind, backend)
    context.progress.step(f"{kind.name} (PT2E, XNNPACK): gate {gate.verdict}")
    made_by = {"tool": "torchao.quantization.pt2e (prepare_pt2e, convert_pt2e) + to_edge_transform_and_lower",
               **QUANTIZER, "calibration_images": len(context.calibration), "timings": timings,
               "latency_ms_batch1": contract["latency_ms_batch1"], "delegate": contract["delegate"]}
    return Variant(kind=kind.name, path=path, format=kind.format, precision=kind.precision,
                   run_precision=kind.run_precision, source=source.kind, made_by=made_by, gate=gate,
                   images_per_s=context.held_out.speed(backend))


def quantize(program: torch.export.ExportedProgram, images: torch.Tensor) -> torch.fx.GraphModule:
    """The program's graph with int8 weights and activations, ranges observed on `images`."""
    try:
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    except ImportError as error:
        raise ExportError(f"executorch-int8 needs the executorch package ({error}); {INSTALL}") from None
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    prepared = prepare_pt2e(program.module(), quantizer)
    rows = _max_rows(program)
    with torch.no_grad():
        for start in range(0, len(images), rows):
            prepared(images[start:start + rows])
    return convert_pt2e(prepared)


def reexport(module: torch.fx.GraphModule, program: torch.export.ExportedProgram,
             images: torch.Tensor) -> torch.export.ExportedProgram:
    """The quantized graph exported with the fp32 program's batch range."""
    if _max_rows(program) == 1:
        return torch.export.export(module, (images[:1],))
    batch = torch.export.Dim(BATCH_DIM, min=1, max=MAX_BATCH)
    return torch.export.export(module, (images[:2],), dynamic_shapes=({0: batch},))


def _max_rows(program: torch.export.ExportedProgram) -> int:
    """MAX_BATCH for a program with a dynamic batch, else its one fixed batch."""
    name = program.graph_signature.user_inputs[0]
    node = next(n for n in program.graph.nodes if n.op == "placeholder" and n.name == name)
    batch = node.meta["val"].shape[0]
    return batch if isinstance(batch, int) else MAX_BATCH
