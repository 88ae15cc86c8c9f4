"""TorchScript's intermediates: the artifact's own inlined graph, run by TorchScript's interpreter with every
tensor value also returned, keyed by the module hierarchy TorchScript kept on each node.

Traced and scripted modules (as torch.jit.load gives them back) both work. What it sees: every tensor made by a
top-level node of the inlined graph, copied as soon as it is made (so a later in-place op, `relu_` or `+=`,
does not overwrite it), with the node's ATen kind and the line of the model's code that made it. What it cannot
see: values made inside If/Loop blocks, only the If/Loop's outputs, keyed by the module their nodes share (a
scripted DenseNet's layers run their bn/relu/conv under an `if`: those layers show only their last conv); a
module that makes no node (nn.Identity, eval-mode StochasticDepth) has no tap; two calls of one module with no
value made between them (`f(f(x))`) read as one call, since the hierarchy says which module a node is in, not
which call.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import dataclass

import torch

from export.divergence.taps import CallCounter, Keep, Tap, as_value, call_key, is_model_code

NOTE = "TorchScript's own interpreter, its inlined graph with every tensor value returned (copied when made)"

# parameters, constants, the placeholder of a branch that raises: no op ran to make them
_NOT_COMPUTED = ("prim::GetAttr", "prim::Constant", "prim::Uninitialized")
_NOT_MODULES = ("SELF", "UNKNOWN_INSTANCE")  # scripted scopes: a module's own method, a free function
_TRACED_FRAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): \S+$", re.MULTILINE)  # innermost first
_SCRIPTED_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


@dataclass
class _Site:
    """One tensor value of the graph that becomes a tap."""

    value: torch._C.Value
    op: str
    path: str
    key: str = ""
    source: str = ""


class TorchScriptTaps:
    note = NOTE

    def __init__(self, module: torch.jit.ScriptModule):
        self.module = module
        self.paths = ModulePaths(module)
        self.call_lines = module_call_lines(module)

    @classmethod
    def from_file(cls, path, map_location: str | torch.device = "cpu") -> TorchScriptTaps:
        return cls(torch.jit.load(str(path), map_location=map_location).eval())

    def taps(self, batch: torch.Tensor, keep: Keep) -> list[Tap]:
        graph = self.module.inlined_graph  # a fresh copy each time: it is rewritten below
        sites = self.sites(graph)
        kept = [keep(site.key) for site in sites]
        return_taps(graph, sites, kept)
        function = torch._C._create_function_from_graph("divergence_taps", graph)
        with torch.inference_mode():
            returned = iter(function(self.module._c, batch))
        return list(filter(None, (read_tap(site, keep_value, returned) for site, keep_value in zip(sites, kept))))

    def sites(self, graph: torch._C.Graph) -> list[_Site]:
        """The graph's computed tensor values in execution order, with their call keys and source lines."""
        sites = [_Site(value, node.kind(), self.paths.of_node(node)) for node in graph.nodes()
                 if node.kind() not in _NOT_COMPUTED for value in node.outputs() if is_tensor(value)]
        for site, calls in zip(sites, open_calls(site.path for site in sites)):
            site.key = call_key(*calls[-1])
            site.source = own_source(site.value.node()) or self.caller_line(calls)
        return sites

    def caller_line(self, calls: list[tuple[str, int]]) -> str:
        """Where the model's code made the innermost of these module calls that the model's code made."""
        for path, call in reversed(calls):
            lines = self.call_lines.get(path, [])
            if call < len(lines) and lines[call]:
                return lines[call]
        return ""


# ---------------------------------------------------------------- keys: module paths and calls

class ModulePaths:
    """Module paths from TorchScript's module hierarchies, checked against the module tree: a hierarchy names
    each call by the attribute it was called through, so `self.blocks[0](x)` (a ModuleList, never called
    itself) reads "0(Conv2d)" and is found as "blocks.0" here."""

    def __init__(self, module: torch.jit.ScriptModule):
        self.types = {path: getattr(m, "original_name", "") for path, m in module.named_modules(remove_duplicate=False)}
        self.resolved: dict[str, str] = {}

    def of_node(self, node: torch._C.Node) -> str:
        """A node's module path. No hierarchy means the root's own forward, except on an If/Loop, which
        TorchScript leaves without one wherever it was inlined from: those take the module their nodes share."""
        if node.getModuleHierarchy() or not list(node.blocks()):
            return self.of_hierarchy(node.getModuleHierarchy())
        return common_path([self.of_node(n) for block in node.blocks() for n in block.nodes()
                            if n.kind() not in _NOT_COMPUTED])

    def of_hierarchy(self, hierarchy: str) -> str:
        """"layer1(Sequential).0(BasicBlock).conv1(Conv2d)" (traced) or "SELF(ResNet).layer1(Sequential)...
        .conv1(Conv2d).SELF(Conv2d)" (scripted) -> "layer1.0.conv1"; "" for the root."""
        if hierarchy not in self.resolved:
            path = ""
            for scope in split_scopes(hierarchy):
                name, _, type_name = scope.rstrip(")").partition("(")
                if name not in _NOT_MODULES:
                    path = self.child(path, name, type_name)
            self.resolved[hierarchy] = path
        return self.resolved[hierarchy]

    def child(self, parent: str, name: str, type_name: str) -> str:
        """The module `name` called from `parent`: its attribute, else one inside a container attribute of
        it (ModuleList, ModuleDict) of the hierarchy's type; the first such when several are."""
        direct = f"{parent}.{name}" if parent else name
        if direct in self.types:
            return direct
        prefix = f"{parent}." if parent else ""
        nested = [path for path, kind in self.types.items() if path.startswith(prefix) and path.endswith(f".{name}")
                  and path.count(".") == direct.count(".") + 1 and kind == type_name]
        return nested[0] if nested else direct


def split_scopes(hierarchy: str) -> list[str]:
    """Splits at the dots outside parentheses (a type may hold a dot)."""
    scopes, depth, start = [], 0, 0
    for index, char in enumerate(hierarchy):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "." and depth == 0:
            scopes.append(hierarchy[start:index])
            start = index + 1
    return [*scopes, hierarchy[start:]] if hierarchy else []


def common_path(paths: list[str]) -> str:
    """The deepest module enclosing all the paths ("" for none)."""
    return ".".join(os.path.commonprefix([path.split(".") if path else [] for path in paths]))


def open_calls(paths) -> list[list[tuple[str, int]]]:
    """For each value's module path, the module calls it was made in, outermost first, as (path, call index).
    A call starts where a value's path enters a module the previous value was not in (eager's hook order)."""
    counter = CallCounter()
    current: list[tuple[str, int]] = []
    found = []
    for path in paths:
        chain = enclosing_paths(path)
        shared = 0
        while shared < min(len(chain), len(current)) and current[shared][0] == chain[shared]:
            shared += 1
        entered = [(p, int(counter.key(p).partition("@")[2] or 0)) for p in chain[shared:]]
        current = current[:shared] + entered
        found.append(current)
    return found


def enclosing_paths(path: str) -> list[str]:
    """"layer1.0.conv1" -> ["", "layer1", "layer1.0", "layer1.0.conv1"]."""
    names = path.split(".") if path else []
    return [""] + [".".join(names[:end]) for end in range(1, len(names) + 1)]


# ---------------------------------------------------------------- sources: the model's lines

def own_source(node: torch._C.Node) -> str:
    """The innermost frame of the model's code in the node's source range, as "file:line" ("" when none).
    Traced nodes keep the tracer's whole Python stack ("file.py(93): forward", innermost first); scripted ones
    only the line of their own function ('File "file.py", line 93'), then the serialized code's, skipped."""
    text = node.sourceRange().split("Serialized", 1)[0]
    frames = [*_TRACED_FRAME.finditer(text), *_SCRIPTED_FRAME.finditer(text)]
    for frame in frames:
        file = frame["file"].strip()
        if os.path.isabs(file) and is_model_code(file):
            return f"{file}:{frame['line']}"
    return ""


def module_call_lines(module: torch.jit.ScriptModule) -> dict[str, list[str]]:
    """For each submodule path, the model's line of each of its calls in order ("" for a call made from torch's
    code, as nn.Sequential's): read from the uninlined graphs' CallMethod nodes. A scripted node inlined from
    torch's code (conv2d, batch_norm) keeps only its own line, so its tap takes its module call's line."""
    lines: dict[str, list[str]] = defaultdict(list)

    def walk(owner: torch.jit.ScriptModule, path: str, method: str) -> None:
        graph = owner._c._get_method(method).graph
        modules = {next(graph.inputs()).unique(): (path, owner)}  # values that are modules -> path, module
        for node in graph.nodes():
            if node.kind() == "prim::GetAttr" and node.input().unique() in modules:
                parent, parent_module = modules[node.input().unique()]
                child = getattr(parent_module, node.s("name"))
                if isinstance(child, torch.jit.ScriptModule):
                    name = f"{parent}.{node.s('name')}" if parent else node.s("name")
                    modules[node.output().unique()] = (name, child)
            elif node.kind() == "prim::CallMethod" and node.inputsAt(0).unique() in modules:
                callee, callee_module = modules[node.inputsAt(0).unique()]
                if callee != path:  # a module's own helper method (ResNet._forward_impl) is not a call
                    lines[callee].append(own_source(node))
                walk(callee_module, callee, node.s("name"))

    walk(module, "", "forward")
    return dict(lines)


# ---------------------------------------------------------------- running the graph

def is_tensor(value: torch._C.Value) -> bool:
    return isinstance(value.type(), torch._C.TensorType)


def return_taps(graph: torch._C.Graph, sites: list[_Site], kept: list[bool]) -> None:
    """Makes the graph return, for each site, a copy of its value made right after it (kept) or its size and
    whether it is floating (not kept: nothing held), all in one flat tuple."""
    returned = []
    for site, keep_value in zip(sites, kept):
        ops = ["aten::clone"] if keep_value else ["aten::size", "aten::is_floating_point"]
        returned += [insert_after(graph, site.value, op) for op in ops]
    output = graph.insertNode(graph.create("prim::TupleConstruct", returned)).output()
    output.setType(torch._C.TupleType([value.type() for value in returned]))
    output.node().moveBefore(graph.return_node())
    graph.return_node().replaceInput(0, output)


def insert_after(graph: torch._C.Graph, value: torch._C.Value, op: str) -> torch._C.Value:
    with graph.insert_point_guard(value.node()):  # its constant arguments land before the node, it after
        made = graph.insert(op, [value])
    made.node().moveAfter(value.node())
    return made


def read_tap(site: _Site, keep_value: bool, returned) -> Tap | None:
    """Takes this site's items from the `returned` iterator; a Tap, or None for a value that is not floating."""
    if keep_value:
        value = as_value(next(returned))
        if value is None:
            return None
        return Tap(site.key, site.op, site.source, value, tuple(value.shape), site.value.debugName())
    size, floating = next(returned), next(returned)
    if not floating:
        return None
    return Tap(site.key, site.op, site.source, None, tuple(size), site.value.debugName())

