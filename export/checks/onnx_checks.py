"""onnx.checker (full check) and strict shape inference on every ONNX file; count control-flow nodes."""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from pathlib import Path

import onnx

from export.errors import OnnxCheckError

CONTROL_FLOW_ONNX = ("If", "Loop", "Scan")
CONTROL_FLOW_TORCHSCRIPT = ("prim::If", "prim::Loop")


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
