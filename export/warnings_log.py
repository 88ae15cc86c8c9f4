"""Collect warnings (torch.jit deprecation FutureWarnings, TracerWarnings, exporter chatter) per step.

They are summarised once at the end and recorded in the manifest instead of being sprayed on the terminal.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
import warnings
from collections import Counter
from dataclasses import dataclass, field

OUTPUT_LINES_KEPT = 20  # per step: enough to read what an exporter said, not a log dump


@dataclass
class WarningLog:
    counts: Counter = field(default_factory=Counter)
    output: dict = field(default_factory=dict)  # step -> lines exporters printed (first OUTPUT_LINES_KEPT)

    @contextlib.contextmanager
    def capture(self, step: str):
        """Record warnings raised inside, and what exporters print to stdout/stderr, for the manifest."""
        chatter = io.StringIO()
        with warnings.catch_warnings(record=True) as caught, \
                contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
            warnings.simplefilter("always")
            try:
                yield
            finally:
                for record in caught:
                    message = str(record.message).strip().splitlines()[0][:300]
                    self.counts[(step, record.category.__name__, message)] += 1
                self._keep_output(step, chatter.getvalue())

    @contextlib.contextmanager
    def native_output(self, step: str):
        """Also keep what native code prints to the process's stdout and stderr (file descriptors 1 and 2: the
        legacy ONNX exporter prints a whole TorchScript graph from C++ when it refuses a model). Only around
        steps that print no progress themselves: the progress lines go to the same descriptors."""
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        with tempfile.TemporaryFile() as sink:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                for descriptor in saved:
                    os.close(descriptor)
                sink.seek(0)
                self._keep_output(step, sink.read().decode(errors="replace"))

    def _keep_output(self, step: str, text: str) -> None:
        lines = [line.rstrip()[:300] for line in text.splitlines() if line.strip()]
        if lines:
            kept = self.output.setdefault(step, {"lines": [], "total_lines": 0})
            kept["lines"] = (kept["lines"] + lines)[:OUTPUT_LINES_KEPT]
            kept["total_lines"] += len(lines)

    def output_as_dict(self) -> dict:
        return dict(self.output)

    def of_category(self, category: str) -> list[dict]:
        return [entry for entry in self.as_list() if entry["category"] == category]

    def as_list(self) -> list[dict]:
        return [{"step": step, "category": category, "message": message, "count": count}
                for (step, category, message), count in self.counts.items()]

    def summary_line(self) -> str:
        if not self.counts:
            return "no warnings captured"
        by_category = Counter()
        for (_, category, _), count in self.counts.items():
            by_category[category] += count
        kinds = ", ".join(f"{category} x{count}" for category, count in by_category.most_common())
        return f"captured {sum(by_category.values())} warnings ({kinds}); details in manifest.json 'warnings'"
