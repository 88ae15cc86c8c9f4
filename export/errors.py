"""The export room's errors, all in the one family rooted at contract.errors.VisionExportError."""

from __future__ import annotations

from contract.errors import EXIT_PARITY, VisionExportError
from runtime.integrity import IntegrityError  # noqa: F401  (re-exported: the manifest check raises it)


class ExportError(VisionExportError):
    """An export cannot proceed as asked; the message says why and what to do."""


class EvalModeError(ExportError):
    """The module is not ready for inference: a submodule still trains, or outputs are not repeatable."""


class OutputDirError(ExportError):
    """The output folder cannot be created or written."""


class OnnxCheckError(ExportError):
    """An ONNX file failed onnx.checker or shape inference."""


class ParityError(ExportError):
    """One or more artifacts disagree with eager PyTorch beyond tolerance; carries the numbers."""

    exit_code = EXIT_PARITY

    def __init__(self, failures: list, table: str, divergence: list[str] = ()):
        self.failures = failures  # list[export.checks.parity.Comparison]
        self.table = table
        self.divergence = list(divergence)  # one line per failing form: where it first diverges
        worst = max(failures, key=lambda c: c.metrics["max_abs"])
        names = sorted({c.artifact for c in failures})
        super().__init__(
            f"parity failed for {', '.join(names)}: worst max_abs={worst.metrics['max_abs']:.3g} "
            f"({worst.tolerance.describe()}) on {worst.artifact} / {worst.inputs}; "
            "do not ship these artifacts; see parity.md for every number"
            + "".join(f"\n  {line}" for line in self.divergence))
