"""A form the export refused (it failed parity's inputs, or failed in the graph on one) has no file left to
explain; it is made again here with the export's own exporter, from the rebuilt model (the manifest's weights,
checked by their fingerprint) and the model's tracing example, into a temporary folder. A refusal at build
(the exporter itself failed) has nothing to explain layer by layer: its message is the explanation."""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

from export.errors import ExportError
from export.forms import exporters, kinds

UNMADE_STEPS = ("build", "needs")  # the form never existed: nothing to run


@dataclass(frozen=True)
class Form:
    """A form's file to explain: the export's own, or one made again (with why, in `note`)."""

    format: str
    path: Path
    spatial_dynamic: bool
    note: str = ""


@contextlib.contextmanager
def remade(kind: str, manifest, entry, module, progress):
    """The refused form made again, its file removed afterwards."""
    refusal = manifest.refused[kind]
    if refusal.step in UNMADE_STEPS:
        raise ExportError(f"--kind {kind}: the export could not make it ({refusal.line()}), so there is no form "
                          f"to compare layer by layer; explain one of {', '.join(manifest.artifacts)}")
    with tempfile.TemporaryDirectory(prefix=f"explain-{kind}-") as folder:
        context = _context(manifest, entry, module, Path(folder))
        try:
            artifact = _build(kinds.get(kind), context)
        except Exception as error:  # noqa: BLE001 - made once by the export; a failure now is said in one line
            raise ExportError(f"--kind {kind}: refused by the export ({refusal.line()}) and could not be made again "
                              f"to explain it ({type(error).__name__}: {str(error)[:200]})") from None
        progress.step(f"{kind} was refused by the export ({refusal.step}: {refusal.error}); made again from the "
                      "rebuilt model and its tracing example to explain it")
        yield Form(artifact.format, artifact.path, artifact.spatial_dynamic,
                   note=f"{kind} was refused by the export ({refusal.line()}); explained as made again here from "
                        "the same weights and tracing example")


def _context(manifest, entry, module, folder: Path) -> exporters.BuildContext:
    spec = entry.input_spec
    return exporters.BuildContext(module, exporters.torch_export_form(module), entry.example_input(), folder,
                                  manifest.opset, spec.resizes_in_graph,
                                  io=exporters.GraphIO(entry.outputs, spec.dynamic_batch, spec.resize_rule is not None))


def _build(kind, context: exporters.BuildContext):
    """The kind and the kinds it is made from (onnx-traced needs traced), in order."""
    for need in kind.needs:
        if need not in context.built:
            context.built[need] = _build(kinds.get(need), context)
    return kind.build(context, kind)
