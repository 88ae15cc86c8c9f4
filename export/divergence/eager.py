"""Eager PyTorch's intermediates, the reference every form is matched against: a forward hook on every module
records its output, keyed by module path and call. Its line is the model's code that made the module's output:
the innermost frame of the model's code at the module's last torch call (what torch.export's stack traces name),
so a form that took another path shows another line."""

from __future__ import annotations

import inspect

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from export.divergence.taps import CallCounter, Keep, Tap, as_value, current_model_frame

NOTE = "eager PyTorch, a forward hook on every module"


class _LastLine(TorchFunctionMode):
    """Remembers the model's line behind the latest torch call."""

    line = ""
    paused = False  # while our own hook runs: its torch calls are not the model's

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            self.line = current_model_frame()
        return func(*args, **(kwargs or {}))


class EagerTaps:
    note = NOTE

    def __init__(self, module: nn.Module):
        self.module = module
        self.paths = {id(m): path for path, m in module.named_modules(remove_duplicate=False)}
        self.types = {path: type(m) for path, m in module.named_modules(remove_duplicate=False)}

    def taps(self, batch: torch.Tensor, keep: Keep) -> list[Tap]:
        found: list[Tap] = []
        counter, last = CallCounter(), _LastLine()

        def record(module, args, output):
            last.paused = True
            try:
                _record(module, output, last.line)
            finally:
                last.paused = False

        def _record(module, output, line):
            path = self.paths.get(id(module))
            values = list(output) if isinstance(output, (tuple, list)) else [output]
            floats = [v for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()]
            if path is None or not floats:
                return
            key, tensor = counter.key(path), floats[0]
            others = tuple(as_value(v) for v in floats[1:]) if keep(key) else ()
            found.append(Tap(key, type(module).__name__, line, as_value(tensor) if keep(key) else None,
                             tuple(tensor.shape), name=key, others=others))

        handles = [m.register_forward_hook(record) for m in self.module.modules()]
        try:
            with torch.inference_mode(), last:
                self.module(batch)
        finally:
            for handle in handles:
                handle.remove()
        return found

    def output(self, batch: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.module(batch)

    def definition(self, path: str) -> str:
        """Where the module's class defines forward, as "file:line" ("" for torch's own modules)."""
        cls = self.types.get(path)
        if cls is None or cls.__module__.startswith("torch."):
            return ""
        try:
            _, start = inspect.getsourcelines(cls.forward)
            return f"{inspect.getsourcefile(cls.forward)}:{start}"
        except (OSError, TypeError):
            return ""
