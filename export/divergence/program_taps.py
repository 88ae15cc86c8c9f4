"""ExportedProgram intermediates: the program's graph run node by node by torch.fx's Interpreter (eager's own
kernels), each node tied to its module by torch.export's `nn_module_stack` and to the model's line by its
`stack_trace`; a torch.cond is entered, and the branch the input takes is run the same way. AOTInductor compiles such a program into one fused library with no intermediates to read: its
report runs the program it was compiled from instead, and says so."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.fx

from export.divergence.taps import Keep, Tap, as_value, call_key, known_path, last_model_frame

NOTE = "torch.fx Interpreter over the ExportedProgram's graph; modules and lines from nn_module_stack / stack_trace"
NOTE_AOTI = ("AOTInductor's compiled library keeps no intermediates: these are the ExportedProgram it was compiled "
             "from (run by torch.fx's Interpreter), beside the package's own output error")


class ProgramTaps:
    def __init__(self, program: torch.export.ExportedProgram, note: str = NOTE, known: set[str] | None = None):
        self.module = program.module()
        self.note = note
        self.known = known  # eager's module paths, to name a wrapper's paths as eager does

    @classmethod
    def from_file(cls, path: Path, note: str = NOTE, known: set[str] | None = None) -> ProgramTaps:
        return cls(torch.export.load(str(path)), note, known)

    def taps(self, batch: torch.Tensor, keep: Keep) -> list[Tap]:
        found: list[Tap] = []
        outer = self

        class Recorder(torch.fx.Interpreter):
            def run_node(self, node):
                if node.op == "call_function" and node.target is torch.ops.higher_order.cond:
                    return self._taken_branch(node)
                result = super().run_node(node)
                tap = node_tap(node, result, keep, outer.known)
                if tap is not None:
                    found.append(tap)
                return result

            def _taken_branch(self, node):
                """torch.cond: the branch this input takes, run node by node too (its nodes keep their modules)."""
                (predicate, when_true, when_false, operands), _ = self.fetch_args_kwargs_from_env(node)
                branch = when_true if bool(predicate) else when_false
                return Recorder(branch).run(*operands)

        with torch.inference_mode():
            Recorder(self.module).run(batch)
        return found


def node_tap(node: torch.fx.Node, result, keep: Keep, known: set[str] | None = None) -> Tap | None:
    """The node's output as a tap, keyed by the innermost module of its nn_module_stack."""
    stack = node.meta.get("nn_module_stack")
    if node.op != "call_function" or not stack:
        return None
    value = as_value(result[0] if isinstance(result, (tuple, list)) and result else result)
    if value is None:
        return None
    stack_key, (path, _type) = list(stack.items())[-1]
    call = int(stack_key.rpartition("@")[2]) if "@" in stack_key else 0
    key = call_key(known_path(_eager_path(path), known), call)
    return Tap(key, str(node.target), last_model_frame(node.meta.get("stack_trace")),
               value if keep(key) else None, tuple(value.shape), name=node.name)


def _eager_path(path: str) -> str:
    """nn_module_stack's path as named_modules spells it (older torch wrote L['self'].layer1[0])."""
    return path.replace("L['self'].", "").replace("[", ".").replace("]", "") if path.startswith("L[") else path
