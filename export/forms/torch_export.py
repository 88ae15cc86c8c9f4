"""Exporter functions for torch.export's own artifacts (rows of export.forms.kinds):

  exported_program  torch.export.export -> torch.export.save: an ExportedProgram `.pt2` (ATen graph, the batch and
                    an in-graph resize kept as symbolic dimensions, data-dependent branches as torch.cond)
  aot_inductor      the same program compiled by AOTInductor into a `.pt2` package (a shared library for this
                    torch build and this device), with the build it is tied to written inside (runtime.aoti)

The program is exported once per export (BuildContext.program) and shared with the torch.export-based ONNX
exporter (export.forms.exporters.onnx_dynamo).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from contract.files import atomic_write_bytes
from export.forms.exporters import Artifact, BuildContext
from runtime.aoti import BUILD_FILE, build_facts

# Inductor settings of the AOTInductor kind, from `python -m measure aoti-tuning` (docs/results/2026-11-24-aoti-tuning-resnet50/analysis.md): freezing,
# oneDNN weight pre-packing and static batches gave the same generated code or speed as the defaults on torch
# 2.14 (AOTInductor already folds the weights), max-autotune no gain for a much longer compile. dynamic_threads
# makes the kernels use the thread count of the process that runs them (a serving worker's share), where
# Inductor would otherwise write the exporting process's count into the code when it differs from the cores.
AOTI_CONFIGS = {"cpp.dynamic_threads": True}


def exported_program(context: BuildContext, kind) -> Artifact:
    artifact = context.artifact(kind, loaded=context.program(kind.spatial_dynamic(context.resizes_in_graph)))
    buffer = io.BytesIO()
    torch.export.save(artifact.loaded, buffer)
    atomic_write_bytes(artifact.path, buffer.getvalue())
    return artifact


def aot_inductor(context: BuildContext, kind) -> Artifact:
    """Compiled for context.device from the program with a dynamic batch; the C++ compile is the slow part
    (docs/results/2026-11-24-aoti-tuning-resnet50/analysis.md), so the kind is built only when asked for (--formats)."""
    program = context.program(kind.spatial_dynamic(context.resizes_in_graph), device=context.device)
    package = compile_package(program, context.device)
    artifact = context.artifact(kind, loaded=program)
    atomic_write_bytes(artifact.path, package.data)
    artifact.details["build"] = package.facts
    return artifact


@dataclass
class Package:
    data: bytes  # the .pt2 package, our build record inside
    facts: dict  # the build record (runtime.aoti.build_facts and the Inductor settings)
    code: str  # Inductor's hashes of the generated wrapper and kernel sources: equal = the same program


def compile_package(program: torch.export.ExportedProgram, device: str = "cpu",
                    inductor_configs: dict = AOTI_CONFIGS) -> Package:
    """AOTInductor's compile of the program for device, packaged with the build it is tied to."""
    from torch._inductor import aot_compile
    from torch.export.pt2_archive._package import package_pt2
    args, kwargs = program.example_inputs
    files = aot_compile(program.module(), args, kwargs, options={**inductor_configs, "aot_inductor.package": True})
    facts = {**build_facts(torch.device(device), input_shape(program)), "inductor_configs": inductor_configs}
    buffer = io.BytesIO()
    package_pt2(buffer, aoti_files=files, extra_files={BUILD_FILE: json.dumps(facts)})
    code = "/".join(Path(str(f)).name[:8] for f in files if str(f).endswith((".wrapper.cpp", ".kernel.cpp")))
    return Package(buffer.getvalue(), facts, code)


def input_shape(program: torch.export.ExportedProgram) -> list[int | None]:
    """The first user input's shape, None for each symbolic (dynamic) dimension."""
    name = program.graph_signature.user_inputs[0]
    node = next(n for n in program.graph.nodes if n.op == "placeholder" and n.name == name)
    return [d if isinstance(d, int) else None for d in node.meta["val"].shape]
