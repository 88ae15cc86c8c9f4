"""The one place a user-facing error becomes a message and an exit code, for every command line of the project
(`python -m export`, `python -m serving`, `python -m measure`): an error of the family prints its message, any
table it carries and its notes; Ctrl-C and OS errors (a full disk, a read-only folder) get one line too. Anything
else is a bug and keeps its traceback."""

from __future__ import annotations

import errno
import sys
from typing import Callable

from contract.errors import EXIT_ERROR, EXIT_INTERRUPTED, INTERRUPTIONS, VisionExportError

INTERRUPTED = "interrupted: nothing was swapped into the output folder; re-run to export"


def run_command(command: Callable[[], int], interrupted: str = INTERRUPTED) -> int:
    """command()'s exit code, or the family's: the error said in one line (a parity or accuracy table first)."""
    try:
        return command()
    except VisionExportError as error:
        table = getattr(error, "table", None)  # ParityError and AccuracyGateError carry every number
        if table:
            print(f"\n{table}\n", file=sys.stderr)
        print(f"error: {error}", file=sys.stderr)
        for note in getattr(error, "__notes__", []):
            print(f"  {note}", file=sys.stderr)
        return error.exit_code
    except INTERRUPTIONS:
        print(f"\n{interrupted}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as error:
        print(f"error: {describe_os_error(error)}", file=sys.stderr)
        return EXIT_ERROR


def describe_os_error(error: OSError) -> str:
    if error.errno == errno.ENOSPC:
        return (f"disk full while writing {error.filename or 'the export'}; "
                "free some space or choose another folder with --out")
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"permission denied writing {error.filename}; choose a writable folder with --out"
    return f"{error.strerror or error} ({error.filename})"


def moved(old: str, new: str) -> int:
    """A command that now lives elsewhere: say where (same options), exit 2, run nothing."""
    print(f"`{old}` moved: run `{new}` (same options; `{new} --help`)", file=sys.stderr)
    return 2
