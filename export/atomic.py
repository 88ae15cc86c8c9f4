"""An export folder written all-or-nothing: staged beside its final place, swapped in whole, a failed one kept
apart (a single file is written by contract.files)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from export.errors import OutputDirError

PARTIAL_MARK = ".partial-"


def ensure_writable_dir(path: Path, flag: str = "--out") -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=path, prefix=".write-probe-")
        probe.close()
    except OSError as error:
        raise OutputDirError(f"cannot write to {path} ({error.strerror or error}); "
                             f"choose a writable folder with {flag}") from None


FAILED_SUFFIX = ".failed"
FAILURE_NOTE = "FAILED.txt"


@contextmanager
def staged_directory(final: Path):
    """Build a folder beside `final`, then swap it in whole.

    The previous complete export stays untouched until the swap. A step that fails (an exception) leaves
    its work in `NAME.failed/` (with FAILED.txt saying why) for inspection, and the error says where.
    An interrupted or killed run leaves only a hidden `.NAME.partial-PID` folder, removed by the next run.
    """
    final = Path(final).absolute()
    ensure_writable_dir(final.parent)
    for stale in final.parent.glob(f".{final.name}{PARTIAL_MARK}*"):
        shutil.rmtree(stale, ignore_errors=True)
    stage = final.parent / f".{final.name}{PARTIAL_MARK}{os.getpid()}"
    stage.mkdir()
    try:
        yield stage
    except Exception as error:
        note = _keep_failed(stage, final, error)
        if note:
            error.add_note(note)
        raise
    except BaseException:
        _discard(stage)
        raise
    try:
        _swap_in(stage, final)
    except BaseException:
        _discard(stage)
        raise


def _discard(stage: Path) -> None:
    """Remove an interrupted attempt's folder; a second try for a file that appeared while the first ran, then a
    line saying what is left (the next run removes it) rather than a silent leftover."""
    for _ in range(2):
        try:
            shutil.rmtree(stage)
            return
        except FileNotFoundError:
            return
        except OSError as error:
            problem = error
    print(f"could not remove the interrupted attempt {stage} ({problem}); the next export removes it",
          file=sys.stderr)


def failed_dir(final: Path) -> Path:
    final = Path(final).absolute()
    return final.parent / f"{final.name}{FAILED_SUFFIX}"


def _keep_failed(stage: Path, final: Path, error: Exception) -> str | None:
    """Move a failed attempt to NAME.failed/ (replacing an older one); returns the sentence for the user.
    A step that failed before writing anything leaves nothing to inspect: no folder, no note."""
    failed = failed_dir(final)
    if not any(stage.iterdir()):
        stage.rmdir()
        return None
    try:
        (stage / FAILURE_NOTE).write_text(f"{type(error).__name__}: {error}\n")
        if failed.exists():
            shutil.rmtree(failed)
        os.replace(stage, failed)
    except OSError as problem:
        shutil.rmtree(stage, ignore_errors=True)
        return f"{final} was not changed; the failed attempt could not be kept ({problem})"
    return f"{final} was not changed; the failed attempt is kept in {failed} for inspection"


def _swap_in(stage: Path, final: Path) -> None:
    previous = final.parent / f".{final.name}.previous-{os.getpid()}"
    if final.exists():
        if not final.is_dir():
            raise OutputDirError(f"{final} exists and is not a folder; choose another --out")
        if any(final.iterdir()):
            os.replace(final, previous)
        else:  # an empty folder may sit on another layer (a container image's), where renaming it fails (EXDEV)
            final.rmdir()
    os.replace(stage, final)
    shutil.rmtree(previous, ignore_errors=True)


def ensure_free_space(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    margin = 1.2  # temporary files and reports on top of the artifacts
    if free < needed * margin:
        raise OutputDirError(f"not enough free disk space in {folder}: the export needs about "
                             f"{needed * margin / 1e6:.0f} MB and {free / 1e6:.0f} MB are free; "
                             "free some space or choose another folder with --out")
