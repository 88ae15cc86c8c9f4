"""One error family: every error a user can cause derives from `VisionExportError`.

Each carries a message that says what was wrong and what to do, and the exit code a command line ends
with. The command lines map the family in one place (`export.cli.run_command`); anything else is a bug
and keeps its traceback. This module imports only the standard library: the TorchServe archive ships it
beside runtime/ and handlers/.
"""

from __future__ import annotations

EXIT_ERROR = 1
EXIT_PARITY = 3
EXIT_INTEGRITY = 4
EXIT_INTERRUPTED = 130


class VisionExportError(Exception):
    """Root of every user-facing error."""

    exit_code = EXIT_ERROR
