"""The one record every runner of intermediates returns (a Tap), and the budget that caps what one pass keeps.

A tap's key is the PyTorch module that made the value: its path in the model (`layer3.1.bn2`, "" for the root),
with `@k` for its (k+1)-th call when a module runs more than once (torch.export's own spelling). Every form keeps
that much, under its own spelling (ONNX node names and scopes, nn_module_stack, TorchScript's module
hierarchy); each runner turns it into the key, so the comparator matches taps across forms by key alone.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import torch

# What one pass may keep of intermediates (eager's and the form's together); a model whose taps need more is
# compared in several passes, each keeping a slice of the keys (export.divergence.compare.plan_passes).
MEMORY_BUDGET_BYTES = 1 << 30
MAX_ROWS = 2  # rows of the failing batch that are explained: enough for a batch-dependent path, cheap for any model

Keep = Callable[[str], bool]  # key -> whether this pass keeps its value (others are recorded without a value)


@dataclass
class Tap:
    """One intermediate value: which module made it, by what op, from which line of the model's code."""

    key: str  # module path, "@k" for the (k+1)-th call of the same module: the match key across forms
    op: str  # what made it: the module's class (eager), ONNX op type, ATen op, TorchScript node kind
    source: str = ""  # "path/to/model.py:123" in the model's code, where the form kept it ("" when lost)
    value: torch.Tensor | None = None  # float32 on the CPU; None when this pass does not keep the key
    shape: tuple[int, ...] = ()
    name: str = ""  # the form's own name for the value (ONNX tensor, FX node, TorchScript value)
    # eager only: a module answering a tuple (PNet's box offsets and scores) has more than one value; the form's
    # value made last within the module may be any of them, so the others are kept to compare with
    others: tuple[torch.Tensor, ...] = ()

    @property
    def module(self) -> str:
        return self.key.split("@")[0]

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return 4 * count


class TapRunner(Protocol):
    """Runs one form on a batch and returns its taps in execution order (values only for the kept keys)."""

    note: str  # what this runner sees and what it cannot (e.g. "ONNX Runtime with graph optimizations off")

    def taps(self, batch: torch.Tensor, keep: Keep) -> list[Tap]: ...


def keep_all(key: str) -> bool:
    return True


def as_value(tensor) -> torch.Tensor | None:
    """A float tensor as a float32 copy on the CPU (a copy: an in-place op later, e.g. ReLU(inplace=True), would
    change the value kept); None for anything else (ints, bools, tuples)."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
        return None
    return tensor.detach().to("cpu", torch.float32, copy=True)


# ---------------------------------------------------------------- module paths and source lines in each spelling

def call_key(path: str, call: int) -> str:
    return path if call == 0 else f"{path}@{call}"


class CallCounter:
    """Turns a module path into its call key: the first call is the path, the next ones path@1, path@2, ..."""

    def __init__(self):
        self.calls: dict[str, int] = {}

    def key(self, path: str) -> str:
        call = self.calls.get(path, 0)
        self.calls[path] = call + 1
        return call_key(path, call)


def known_path(path: str, known: set[str] | None) -> str:
    """`path` as eager names it: a form made from a wrapper (the torch.export form of a model that resizes in its
    graph holds the model as `wrapped`) names `wrapped.network.fc` what eager names `network.fc`."""
    if not known or path in known:
        return path
    parts = path.split(".")
    for start in range(1, len(parts)):
        if ".".join(parts[start:]) in known:
            return ".".join(parts[start:])
    return path


class OpenCalls:
    """Call keys for a stream of ops that each name only their innermost module (ONNX nodes, graph nodes): an op
    continues a call still open (its module or an ancestor of the previous op's), else opens the next call."""

    def __init__(self):
        self.counter = CallCounter()
        self.open: dict[str, str] = {}  # path -> key of the calls enclosing the previous op

    def key(self, path: str) -> str:
        self.open = {p: k for p, k in self.open.items() if p == path or _is_ancestor(p, path)}
        if path not in self.open:
            self.open[path] = self.counter.key(path)
        return self.open[path]


def _is_ancestor(ancestor: str, path: str) -> bool:
    return ancestor == "" or path.startswith(ancestor + ".")


_TORCH_DIR = str(Path(torch.__file__).resolve().parent) + os.sep
_HERE = str(Path(__file__).resolve().parent) + os.sep
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def is_model_code(file: str) -> bool:
    """Frames of the model's own code: not torch's, not this package's (torchvision's are the model's code)."""
    resolved = str(Path(file).resolve()) if file and not file.startswith("<") else ""
    return bool(resolved) and not resolved.startswith((_TORCH_DIR, _HERE))


def last_model_frame(stack_trace: str | None) -> str:
    """The innermost frame of the model's code in a Python stack trace text (torch.export's `stack_trace`,
    the ONNX exporter's `pkg.torch.onnx.stack_trace`), as "file:line"; "" when none."""
    frames = [(m["file"], m["line"]) for m in _FRAME.finditer(stack_trace or "")]
    for file, line in reversed(frames):
        if is_model_code(file):
            return f"{file}:{line}"
    return ""


def current_model_frame() -> str:
    """The innermost frame of the model's code on the running Python stack, as "file:line"."""
    import sys
    frame = sys._getframe(1)
    while frame is not None:
        if is_model_code(frame.f_code.co_filename):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def short_source(source: str, root: Path | None = None) -> str:
    """A source location relative to the working folder or site-packages, for tables."""
    if not source:
        return ""
    file, _, line = source.rpartition(":")
    path = Path(file)
    for base in filter(None, (root, Path.cwd())):
        try:
            return f"{path.resolve().relative_to(base.resolve())}:{line}"
        except ValueError:
            pass
    parts = path.parts
    if "site-packages" in parts:
        return f"{'/'.join(parts[parts.index('site-packages') + 1:])}:{line}"
    return source
