"""One inference worker of a model's pool under KServe (serving/kserve/pool.py), in the process the pool spawned:
it opens its placement's model through the request core and answers the batches the pool sends it on its pipe.
A spare is spawned without a placement: it does a worker's imports, then waits to be told one. Only this module
(and what it imports) is imported by the spawned process before its placement's model is opened.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from contract.errors import VisionExportError
from contract.policy import ServingPolicy
from handlers.request_error import RequestError

logger = logging.getLogger("serving.kserve")

READY, REFUSED, ANSWERS, FAILED = "ready", "refused", "answers", "failed"  # what a worker sends
ROW_ERROR = "request-error"  # a row's RequestError on the wire: (ROW_ERROR, code, message)


@dataclass(frozen=True)
class Placement:
    """Where a worker serves: what worker_main opens (the unpacked folder, device, handler settings and policy,
    served under served_name) as which worker of its pool (index). A spare is told its placement when it takes a
    place: its own pool's dead worker's, or the first worker's of the pool that borrows it."""
    index: int
    folder: Path
    device: str
    settings: dict | None
    policy: ServingPolicy
    served_name: str


def to_wire(answers: list) -> list:
    return [(ROW_ERROR, a.code, a.message) if isinstance(a, RequestError) else a for a in answers]


def from_wire(answers: list) -> list:
    return [RequestError(a[1], a[2]) if isinstance(a, tuple) and a[0] == ROW_ERROR else a for a in answers]


def worker_main(placement: Placement | None, conn) -> None:
    """A spawned worker (a spare without a placement: it waits for one): open the core, say so, then answer each
    batch until told to stop (None) or the front is gone (end of the pipe)."""
    from handlers.logs import configure_logging
    from handlers.opening import open_archive
    configure_logging()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the front stops us; a terminal's Ctrl-C reaches it alone
    placement = placement or standing_by(conn)
    try:
        core = open_archive(placement.folder, placement.device, placement.policy, placement.settings,
                            served_name=placement.served_name)
    except VisionExportError as error:
        conn.send((REFUSED, str(error), error.exit_code))
        return
    conn.send((READY, core.TASK, core.describe()))
    index = placement.index
    logger.info("inference worker %d ready (pid %d)", index, os.getpid())
    while True:
        rows = from_front(conn)
        try:
            answers = core.run_batch(rows).answers
        except Exception as error:  # the core answers bad rows itself: this is a bug, the request gets a 500
            logger.exception("inference worker %d: batch of %d failed", index, len(rows))
            conn.send((FAILED, f"{type(error).__name__}: {error}"))
            continue
        conn.send((ANSWERS, to_wire(answers)))


def standing_by(conn) -> Placement:
    """A spare's wait, its imports done: the placement it is told to take; it leaves when told to stop (None) or
    when the front is gone (end of the pipe)."""
    import handlers.core  # noqa: F401  (torch and the core, imported by open_archive's open_core otherwise)
    import handlers.tasks  # noqa: F401
    return from_front(conn)


def from_front(conn):
    """The front's next message to this worker; the worker leaves when told to stop (None) or when the front is
    gone (end of the pipe)."""
    try:
        message = conn.recv()
    except (EOFError, OSError):
        message = None
    if message is None:
        leave()
    return message


def leave() -> None:
    """End a worker at once: the interpreter's own finalization of torch and ONNX Runtime takes 2 s (4 s of a
    stop with two workers, measured) and there is nothing of ours left to clean up."""
    logging.shutdown()
    sys.stderr.flush()
    os._exit(0)
