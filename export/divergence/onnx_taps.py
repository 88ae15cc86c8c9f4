"""ONNX intermediates: every node output made a graph output (Polygraphy's "mark all") and run by ONNX Runtime
with graph optimizations off, so each node's own value is kept (a fused kernel would hide the layer inside it).

Each node is tied to the PyTorch module that made it by what the exporter kept: the torch.export-based
exporter writes `pkg.torch.onnx.name_scopes` (module paths) and `pkg.torch.onnx.stack_trace` (the Python stack)
on each node; the TorchScript-based exporter names nodes after the module scope (`/layer1/0/conv1/Conv`) and
keeps no source lines (the report takes eager's line for those).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import torch

from export.divergence.taps import Keep, OpenCalls, Tap, known_path, last_model_frame

NOTE_DYNAMO = ("ONNX Runtime, graph optimizations off, every node output kept; modules and source lines from the "
               "exporter's node metadata")
NOTE_LEGACY = ("ONNX Runtime, graph optimizations off, every node output kept; modules from the node names (the "
               "TorchScript-based exporter keeps no source lines: eager's are shown)")
SCOPES, STACK = "pkg.torch.onnx.name_scopes", "pkg.torch.onnx.stack_trace"
_REPEATED = re.compile(r"^(?P<name>.+)_(?P<call>\d+)$")


class OnnxTaps:
    def __init__(self, path: Path, module_paths: set[str]):
        import onnx
        self.model = onnx.load(str(path))
        self.module_paths = module_paths
        self.with_metadata = any(p.key == SCOPES for n in self.model.graph.node for p in n.metadata_props)
        self.note = NOTE_DYNAMO if self.with_metadata else NOTE_LEGACY

    def taps(self, batch: torch.Tensor, keep: Keep) -> list[Tap]:
        found = self.layout()
        kept = [t for t in found if keep(t.key)]
        for tap, value in zip(kept, self._run(batch, [t.name for t in kept])):
            if value is not None:
                tap.value, tap.shape = value, tuple(value.shape)
        return found

    def layout(self) -> list[Tap]:
        """Every node output tied to its module call, in graph order, without values."""
        found, calls = [], OpenCalls()
        for node in self.model.graph.node:
            path = self._module_path(node)
            if path is None or node.op_type in ("Constant", "Identity"):
                continue
            source = last_model_frame(_metadata(node).get(STACK))
            found += [Tap(calls.key(path), node.op_type, source, name=output) for output in node.output if output]
        return found

    def _module_path(self, node) -> str | None:
        if self.with_metadata:
            scopes = _metadata(node).get(SCOPES)
            if not scopes:
                return None
            names = ast.literal_eval(scopes)
            return known_path(names[-2], self.module_paths) if len(names) >= 2 else ""
        if not node.name.startswith("/"):
            return None
        return self._known_path(node.name.split("/")[1:-1])

    def _known_path(self, parts: list[str]) -> str | None:
        """The TorchScript-based exporter's scope, as a module path ('relu_1' is the second call of 'relu')."""
        path = ".".join(parts)
        if path in self.module_paths:
            return path
        if parts and (match := _REPEATED.match(parts[-1])):
            base = ".".join(parts[:-1] + [match["name"]])
            if base in self.module_paths:
                return base
        return None

    def _run(self, batch: torch.Tensor, names: list[str]) -> list[torch.Tensor | None]:
        import onnx
        import onnxruntime as ort
        if not names:
            return []
        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        del model.graph.output[:]
        model.graph.output.extend(onnx.ValueInfoProto(name=name) for name in names)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 3
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        outputs = session.run(names, {session.get_inputs()[0].name: batch.numpy()})
        return [torch.from_numpy(np.asarray(o, dtype=np.float32)) if np.issubdtype(np.asarray(o).dtype, np.floating)
                else None for o in outputs]


def _metadata(node) -> dict[str, str]:
    return {p.key: p.value for p in node.metadata_props}
