"""Ctrl-C during an export always stops it. A refused form is recorded and the export goes on
(export/refusals.py), and exporters run C++ that may turn a KeyboardInterrupt raised in a Python callback
into an ordinary exception; without this flag, an interrupt arriving there would be recorded as that form's
refusal and the export would finish (exit 0). The handler remembers the signal, then raises as Python's
default handler does; the pipeline checks the flag at every progress step and every refusal."""

from __future__ import annotations

import signal
import threading

_interrupted = threading.Event()


def _remember_and_raise(signum, frame):
    _interrupted.set()
    signal.default_int_handler(signum, frame)


def watch() -> None:
    """Install the handler (main thread only: signals are delivered there) and clear the flag."""
    _interrupted.clear()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _remember_and_raise)


def stop_if_interrupted() -> None:
    if _interrupted.is_set():
        raise KeyboardInterrupt
