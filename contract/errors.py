"""One error family: every error a user can cause derives from `VisionExportError`.

Each carries a message that says what was wrong and what to do, and the exit code a command line ends
with. The command lines map the family in one place (`export.cli.run_command`); anything else is a bug
and keeps its traceback. This module imports only the standard library: the TorchServe archive ships it
beside runtime/ and handlers/.
"""

from __future__ import annotations

from enum import Enum

EXIT_ERROR = 1
EXIT_PARITY = 3
EXIT_INTEGRITY = 4
EXIT_INTERRUPTED = 130


class Stopped(BaseException):
    """SIGTERM, as a command that serves turns it (serving/processes.py: sigterm_interrupts): a stop to clean up
    after, as Ctrl-C is. Not a KeyboardInterrupt: CPython remembers one that reaches certain interpreter frames as
    unhandled, even when a caller handles it, and then ends the process by SIGINT instead of its exit status."""


INTERRUPTIONS = (KeyboardInterrupt, Stopped)  # what run_command and the foreground loops catch as "stop"


class VisionExportError(Exception):
    """Root of every user-facing error."""

    exit_code = EXIT_ERROR


class ImageProblem(Enum):
    """What is wrong with an image the decoder refuses (handlers/ answers each with its HTTP status)."""

    NOT_AN_IMAGE = "not an image"  # PIL cannot identify the bytes
    UNSUPPORTED_FORMAT = "unsupported format"  # PIL reads it, but it is not in contract.policy.ACCEPTED_FORMATS
    TOO_LARGE = "too large"  # over MAX_PIXELS or MAX_SIDE (a decompression bomb included)
    TOO_SMALL = "too small"  # under MIN_SIDE
    CORRUPT = "corrupt"  # PIL failed while parsing or decoding it


class ImageError(VisionExportError):
    """An image the decoder refuses: `problem` says what is wrong with it, the message what to do about it."""

    def __init__(self, problem: ImageProblem, message: str):
        super().__init__(message)
        self.problem = problem
        self.message = message
