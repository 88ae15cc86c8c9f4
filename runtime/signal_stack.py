"""A signal stack that outlives OpenVINO's compiled models.

OpenVINO's CPU plugin (src/plugins/intel_cpu/src/sigstack_manager.cpp) gives the thread that compiles a model a new
alternate signal stack (AMX's signal frames outgrow the default one), owned by that compiled model: its destructor
frees it and, when it is still the thread's stack, puts back the one it replaced. Two compiled models destroyed in
the order they were made leave the thread on the first one's stack, already freed. The next signal delivered there
kills the process with SIGSEGV, and Python installs every handler of its own to run there (SIGINT, a server's
SIGTERM, torch DataLoader's SIGCHLD): found when a test process died at its next subprocess after serving
openvino-int8 in-process (2026-11-25). After each compile the thread is moved onto a stack of ours that is never
freed, so no compiled model finds its own stack current and none puts back a freed one.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import sys
import threading

log = logging.getLogger(__name__)

STACK_BYTES = 64 * 1024  # above AMX's ~11 KiB signal frame and OpenVINO's own AT_MINSIGSTKSZ + SIGSTKSZ
SS_ONSTACK = 1  # <signal.h>: the thread is running on its alternate stack now


class StackT(ctypes.Structure):
    """<signal.h> stack_t."""
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


# native thread id -> every stack given to it; never freed (a model may still name one)
_kept: dict[int, list[ctypes.Array[ctypes.c_char]]] = {}
_lock = threading.Lock()


def current_signal_stack() -> StackT:
    """The calling thread's alternate signal stack (ss_sp None: it has none)."""
    stack = StackT()
    if _libc().sigaltstack(None, ctypes.byref(stack)) != 0:
        raise OSError(ctypes.get_errno(), "sigaltstack could not be read")
    return stack


def keep_signal_stack() -> None:
    """Move the calling thread onto a never-freed alternate signal stack of ours, at least as large as the one it
    is on; call it right after anything that compiles an OpenVINO model on this thread. Linux only (elsewhere the
    plugin sets none)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        current = current_signal_stack()
        thread = threading.get_native_id()
        with _lock:
            kept = _kept.setdefault(thread, [])
            if (current.ss_flags & SS_ONSTACK) or (kept and current.ss_sp == ctypes.addressof(kept[-1])):
                return
            if not kept or len(kept[-1]) < current.ss_size:
                kept.append(ctypes.create_string_buffer(max(STACK_BYTES, current.ss_size)))
            ours = StackT(ctypes.addressof(kept[-1]), 0, len(kept[-1]))
            if _libc().sigaltstack(ctypes.byref(ours), None) != 0:
                raise OSError(ctypes.get_errno(), "sigaltstack refused our stack")
    except OSError as error:  # the process still runs; a signal may kill it later, so say why
        log.warning("could not keep this thread's signal stack (%s): a signal after an OpenVINO model is released "
                    "may end the process with SIGSEGV", error)


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.sigaltstack.argtypes = (ctypes.POINTER(StackT), ctypes.POINTER(StackT))
    return libc
