"""Each fp32 form's structural checks and control-flow census, chosen by its format: onnx.checker (full check)
and strict shape inference on every ONNX file; If/Loop nodes counted in ONNX graphs, prim::If/prim::Loop in
TorchScript, torch.cond/torch.while_loop in torch.export programs (the census of the trace-vs-script report). A
format without an entry here is not inspected."""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from pathlib import Path

import onnx

from export.errors import OnnxCheckError
from export.forms import kinds
from export.forms.exporters import Artifact

CONTROL_FLOW_ONNX = ("If", "Loop", "Scan")
CONTROL_FLOW_TORCHSCRIPT = ("prim::If", "prim::Loop")
CONTROL_FLOW_PROGRAM = ("cond", "while_loop")


def inspect_artifact(artifact: Artifact) -> None:
    """The checks and census of the artifact's format, recorded on it; raises when the file fails them."""
    inspection = INSPECTIONS.get(artifact.format)
    if inspection:
        inspection(artifact)


def _inspect_onnx(artifact: Artifact) -> None:
    artifact.checks = check_onnx(artifact.path)
    artifact.control_flow = onnx_control_flow(artifact.path)


def _inspect_torchscript(artifact: Artifact) -> None:
    artifact.control_flow = torchscript_control_flow(artifact.loaded)


def _inspect_program(artifact: Artifact) -> None:
    artifact.control_flow = program_control_flow(artifact.loaded)


def check_onnx(path: Path) -> dict:
    try:
        onnx.checker.check_model(str(path), full_check=True)
        with tempfile.TemporaryDirectory() as scratch:
            inferred = os.path.join(scratch, "inferred.onnx")
            onnx.shape_inference.infer_shapes_path(str(path), inferred, check_type=True, strict_mode=True)
            model = onnx.load(inferred)
    except Exception as error:
        raise OnnxCheckError(f"{path.name} failed the ONNX checker: {str(error).strip().splitlines()[0]}") from None
    output = model.graph.output[0].type.tensor_type.shape
    return {
        "checker": "passed (full_check)",
        "shape_inference": "passed (strict)",
        "output_shape": [d.dim_param or d.dim_value for d in output.dim],
        "opset": next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None),
    }


def onnx_control_flow(path: Path) -> dict[str, int]:
    model = onnx.load(str(path), load_external_data=False)
    counts = Counter()

    def visit(graph):
        for node in graph.node:
            if node.op_type in CONTROL_FLOW_ONNX:
                counts[node.op_type] += 1
            for attribute in node.attribute:
                if attribute.g.node:
                    visit(attribute.g)
                for sub in attribute.graphs:
                    visit(sub)

    visit(model.graph)
    return {op: counts.get(op, 0) for op in CONTROL_FLOW_ONNX if op != "Scan" or counts.get(op)}


def torchscript_control_flow(module) -> dict[str, int]:
    """Count prim::If / prim::Loop in the inlined graph (submodule calls included), nested blocks too."""
    counts = Counter()

    def visit(block):
        for node in block.nodes():
            if node.kind() in CONTROL_FLOW_TORCHSCRIPT:
                counts[node.kind()] += 1
            for inner in node.blocks():
                visit(inner)

    visit(module.inlined_graph)
    return {op: counts.get(op, 0) for op in CONTROL_FLOW_TORCHSCRIPT}


def program_control_flow(program) -> dict[str, int]:
    """Count torch.cond / torch.while_loop in an ExportedProgram's graph."""
    counts = Counter(node.target.__name__ for node in program.graph.nodes
                     if node.op == "call_function" and getattr(node.target, "__name__", "") in CONTROL_FLOW_PROGRAM)
    return {op: counts.get(op, 0) for op in CONTROL_FLOW_PROGRAM}


INSPECTIONS = {kinds.ONNX: _inspect_onnx, kinds.TORCHSCRIPT: _inspect_torchscript, kinds.TORCH_EXPORT: _inspect_program,
               kinds.AOTI: _inspect_program}
