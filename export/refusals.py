"""Forms an export could not make or keep, each as one `contract.records.Refusal`.

Any step may refuse a form (an exporter, the ONNX checks, loading, running the parity inputs, a reduced-precision
variant): the form is recorded with the exception's type, its first meaningful line and the model code's file and
line when the error points there, printed as one line, and its full traceback appended to export.log in the export
folder. The other forms go on; the pipeline fails only when no form is left to serve.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import sysconfig
import traceback
from pathlib import Path

from contract.files import atomic_write_text
from contract.records import Refusal
from export.interrupt import stop_if_interrupted

EXPORT_LOG = "export.log"  # full tracebacks of refused forms: the terminal gets one line each
MESSAGE_CHARS = 300
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # torch colours some messages for terminals
FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')  # how TorchScript and torch.export point at source
PROJECT = Path(__file__).resolve().parent.parent
STDLIB = str(Path(sysconfig.get_paths()["stdlib"]).resolve())
EXPORTER_PACKAGES = ("torch", "onnx", "onnxruntime", "onnxscript")


@functools.cache
def not_model_code() -> tuple[str, ...]:
    """Folders whose frames are not the model's code: Python, the exporters, and this project's own rooms."""
    packages = [importlib.util.find_spec(name) for name in EXPORTER_PACKAGES]
    folders = [Path(spec.submodule_search_locations[0]) for spec in packages if spec and spec.submodule_search_locations]
    return (STDLIB, *(str(p.resolve()) for p in folders + [PROJECT / room for room in ("export", "runtime", "models")]))


class Refusals:
    """kind -> Refusal for one export, with the terminal line and the export.log traceback of each."""

    def __init__(self, folder: Path, progress):
        self.folder, self.progress = Path(folder), progress
        self.records: dict[str, Refusal] = {}

    def refuse(self, kind: str, step: str, error: BaseException) -> Refusal:
        """`kind` could not be made (or kept) because `step` raised `error`."""
        stop_if_interrupted()  # Ctrl-C that an exporter turned into an ordinary exception is not a refusal
        _append_traceback(self.folder / EXPORT_LOG, kind, step, error)
        return self._add(kind, describe(error, step, EXPORT_LOG))

    def skip(self, kind: str, step: str, message: str) -> Refusal:
        """`kind` was not attempted: `message` says why (e.g. the form it is made from is missing)."""
        return self._add(kind, Refusal(step, "", message))

    def _add(self, kind: str, refusal: Refusal) -> Refusal:
        self.records[kind] = refusal
        self.progress.step(f"{kind} NOT MADE, {refusal.line()}")
        return refusal

    def has_log(self) -> bool:
        return (self.folder / EXPORT_LOG).is_file()


def describe(error: BaseException, step: str, log: str = "") -> Refusal:
    """The refusal record of an exception: its type, the first meaningful line (of the innermost cause when it
    wraps another: torch.export's outer message is the same for every model), and where in the model code."""
    cause = innermost(error)
    message = first_line(str(cause)) or first_line(str(error)) or "(no message)"
    if cause is not error:
        message = f"{type(cause).__name__}: {message}"
    return Refusal(step, type(error).__name__, message[:MESSAGE_CHARS], model_location(error), log)


def innermost(error: BaseException) -> BaseException:
    while error.__cause__ is not None:
        error = error.__cause__
    return error


def first_line(text: str) -> str:
    """The first line that says something (not blank, not only punctuation), without terminal colours."""
    for line in ANSI_ESCAPE.sub("", text).splitlines():
        line = line.strip()
        if re.search(r"\w", line):
            return line.rstrip(":").strip()
    return ""


def model_location(error: BaseException) -> str:
    """file:line in the model's code the error points at: first where the message says (TorchScript, torch.export
    name the source line), else the innermost traceback frame outside Python, torch, ONNX and this project."""
    chain = _chain(error)
    for item in chain:
        for path, line in FILE_LINE.findall(ANSI_ESCAPE.sub("", str(item))):
            if _is_model_code(path):
                return f"{_short(path)}:{line}"
    for item in reversed(chain):
        frames = [f for f in traceback.extract_tb(item.__traceback__) if _is_model_code(f.filename)]
        if frames:
            return f"{_short(frames[-1].filename)}:{frames[-1].lineno}"
    return ""


def _chain(error: BaseException) -> list[BaseException]:
    chain = [error]
    while chain[-1].__cause__ is not None and len(chain) < 20:
        chain.append(chain[-1].__cause__)
    return chain


def _is_model_code(path: str) -> bool:
    if path.startswith("<") or not path.endswith(".py"):
        return False
    resolved = str(Path(path).resolve())
    excluded = [root for root in not_model_code() if resolved.startswith(root + "/")]
    # a third-party model package may live in site-packages under the standard library's folder
    return not excluded or (excluded == [STDLIB] and ("/site-packages/" in resolved or "/dist-packages/" in resolved))


def _short(path: str) -> str:
    """site-packages paths from the package down; others as given."""
    marker = "site-packages/"
    return path.split(marker, 1)[1] if marker in path else path


def _append_traceback(path: Path, kind: str, step: str, error: BaseException) -> None:
    previous = path.read_text() if path.is_file() else ""
    text = "".join(traceback.format_exception(error))
    atomic_write_text(path, f"{previous}--- {kind} refused at {step}\n{text}\n")
