"""Typed errors. Each message says what was wrong and what to do; the CLI prints it as one line."""

from __future__ import annotations


class ExportError(Exception):
    """Base for every error the export command reports without a traceback."""


class EvalModeError(ExportError):
    """The module is not ready for inference: a submodule still trains, or outputs are not repeatable."""


class OutputDirError(ExportError):
    """The output folder cannot be created or written."""


class OnnxCheckError(ExportError):
    """An ONNX file failed onnx.checker or shape inference."""


class IntegrityError(ExportError):
    """Artifacts on disk do not match the sha256 recorded in the manifest."""

    def __init__(self, problems: dict[str, str]):
        self.problems = problems
        listed = "; ".join(f"{name}: {why}" for name, why in problems.items())
        super().__init__(f"artifacts differ from manifest.json ({listed}); re-run the export to rebuild them")


class ParityError(ExportError):
    """One or more artifacts disagree with eager PyTorch beyond tolerance; carries the numbers."""

    def __init__(self, failures: list, table: str):
        self.failures = failures  # list[export.parity.Comparison]
        self.table = table
        worst = max(failures, key=lambda c: c.metrics["max_abs"])
        names = sorted({c.artifact for c in failures})
        super().__init__(
            f"parity failed for {', '.join(names)}: worst max_abs={worst.metrics['max_abs']:.3g} "
            f"(atol={worst.tolerance.atol:g}, rtol={worst.tolerance.rtol:g}) on {worst.artifact} / {worst.inputs}; "
            "do not ship these artifacts; see parity.md for every number")
