"""ExecuTorch programs: torch.export -> to_edge_transform_and_lower with the XNNPACK partitioner -> a `.pte` that
ExecuTorch's runtime loads on Android, iOS, Linux and boards (docs/devices.md), with its input contract beside it.

Why a program of its own rather than the export's shared one (BuildContext.program): ExecuTorch plans every
buffer for the largest input a program accepts, and the shared program's batch reaches exporters.MAX_DIM, so its
buffers would be planned for thousands of images. The device program is exported from the same verified
torch.export form with a batch of at most MAX_BATCH (exactly one image for a model that takes one) at the example's
height x width: a device feeds one fixed-size image, and the serving backend runs larger batches in slices.

A program is refused, naming the operators, when XNNPACK leaves operators outside its delegate for which
ExecuTorch's runtime here has no kernel (a detector's torchvision::nms): such a program would be written and then
fail to load on every device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from contract.files import atomic_write_bytes, atomic_write_text
from contract.records import LABELS_NAME
from export.errors import ExportError
from export.forms.exporters import BATCH_DIM, Artifact, BuildContext, export_example
from runtime.device_programs import batch1_latency
from runtime.executorch import INSTALL, METHOD, contract_name, import_runtime

MAX_BATCH = 8  # the largest batch a program is planned for; its buffers grow with it


class LoweringError(ExportError):
    """A model ExecuTorch cannot lower or run here: the message names the operators."""


@dataclass(frozen=True)
class Lowered:
    program: bytes
    delegated: int  # XNNPACK subgraphs
    portable_ops: tuple[str, ...]  # operators left to ExecuTorch's own kernels


def lower(context: BuildContext, kind) -> Artifact:
    """The fp32 program: the model's torch.export form lowered to XNNPACK, its contract and latency beside it."""
    program = device_program(context)
    artifact = context.artifact(kind, loaded=program)
    artifact.spatial_dynamic = False  # planned for the example's height x width
    lowered = lower_program(program)
    atomic_write_bytes(artifact.path, lowered.program)
    artifact.details = write_contract(context, artifact.path, lowered, "fp32")
    return artifact


def device_program(context: BuildContext) -> torch.export.ExportedProgram:
    """torch.export of the verified torch.export form: a batch of 1 to MAX_BATCH (one image for a model that
    takes one) at the example's height x width."""
    form = context.export_form
    if isinstance(form, BaseException):  # it failed its eval check: the forms made from it are refused with it
        raise form
    import_runtime()  # no executorch package: refused naming the extra before the slow export
    if not context.io.dynamic_batch:
        return torch.export.export(form, (context.example,))
    batch = torch.export.Dim(BATCH_DIM, min=1, max=MAX_BATCH)
    return torch.export.export(form, (export_example(context.example),), dynamic_shapes=({0: batch},))


def lower_program(program: torch.export.ExportedProgram) -> Lowered:
    """XNNPACK takes every subgraph it can; what it leaves must have a kernel in ExecuTorch's runtime."""
    try:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower
    except ImportError as error:
        raise LoweringError(f"lowering needs the executorch package ({error}); {INSTALL}") from None
    try:
        lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()
    except Exception as error:  # noqa: BLE001 - exir raises many types; the message names the operator
        sized_by_data = data_dependent_ops(program)
        if sized_by_data:
            raise LoweringError(f"{', '.join(sized_by_data)} return(s) a tensor whose size depends on the data, "
                                "with no upper bound, and ExecuTorch plans every buffer before it runs "
                                f"({type(error).__name__}: {_first_line(error)})") from error
        raise LoweringError(f"ExecuTorch could not lower it: {type(error).__name__}: {_first_line(error)}") from error
    graphs = [m for m in lowered.exported_program().graph_module.modules() if isinstance(m, torch.fx.GraphModule)]
    targets = [n.target for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    names = [_operator(t) for t in targets if isinstance(t, torch._ops.OpOverload)]  # not a branch, a view, a delegate
    missing = sorted(set(names) - set(import_runtime().Runtime.get().operator_registry.operator_names))
    if missing:
        raise LoweringError(f"XNNPACK does not take {', '.join(missing)} and ExecuTorch's runtime has no kernel "
                            "for it: the program would not load on a device")
    delegated = sum(getattr(t, "__name__", "") == "executorch_call_delegate" for t in targets)
    return Lowered(lowered.buffer, delegated, tuple(sorted(set(names))))


def data_dependent_ops(program: torch.export.ExportedProgram) -> list[str]:
    """The operators whose output size comes from the data (a new unbacked symbol: nms, nonzero), in graph order."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    found = []
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        before = set().union(*(free_unbacked_symbols(n.meta.get("val")) for n in node.all_input_nodes))
        if free_unbacked_symbols(node.meta.get("val")) - before:
            found.append(_operator(node.target))
    return list(dict.fromkeys(found))


def write_contract(context: BuildContext, path, lowered: Lowered, precision: str) -> dict:
    """What a device developer feeds the program, written beside it (runtime.executorch.contract_name), with its
    size and batch-1 latency at one XNNPACK thread and at this machine's cores; returned for the manifest."""
    image = context.image
    contract = {
        "program": path.name, "method": METHOD, "precision": precision, "executorch": _version(),
        "input": {"shape": [f"1..{MAX_BATCH}" if context.io.dynamic_batch else 1, *context.example.shape[1:]],
                  "layout": "NCHW", "dtype": "float32", "values": "RGB in [0, 1] (pixel / 255)",
                  "normalisation": "in the graph: send the pixels scaled to [0, 1], nothing subtracted"},
        "preprocessing": ({"resize_shorter_side_to": image.resize, "centre_crop": list(image.crop),
                           "interpolation": image.interpolation, "source": image.source} if image else None),
        "outputs": list(context.io.outputs),
        "labels": LABELS_NAME if context.labels else None,
    }
    return save_contract(path, contract, lowered, context.example[:1])


def save_contract(path, contract: dict, lowered: Lowered, example: torch.Tensor) -> dict:
    """The contract with the program's delegate, size and latency, written beside it (the backend opens it)."""
    contract = {**contract, "program": path.name,
                "delegate": {"backend": "XnnpackBackend", "subgraphs": lowered.delegated,
                             "portable_ops": list(lowered.portable_ops)},
                "bytes": len(lowered.program)}
    atomic_write_text(path.with_name(contract_name(path.name)), _json(contract))
    contract["latency_ms_batch1"] = batch1_latency("executorch", path, example)
    atomic_write_text(path.with_name(contract_name(path.name)), _json(contract))
    return contract



def _operator(target) -> str:
    name = getattr(target, "name", None)
    return name() if callable(name) else str(target)


def _version() -> str:
    from importlib.metadata import version
    return version("executorch")


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0][:300]


def _json(data: dict) -> str:
    import json
    return json.dumps(data, indent=2) + "\n"
