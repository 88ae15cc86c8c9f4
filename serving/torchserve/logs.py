"""What TorchServe's logs say when it will not serve: a worker that cannot load the model (the handler's own
refusal or exception), an archive the frontend cannot open, a port already taken."""

from __future__ import annotations

import re
from pathlib import Path

# Lines in TorchServe's logs that mean the model will not load; the handler's message is near them.
LOAD_FAILURE = re.compile(r"(Load model failed|Backend worker process died|Worker disconnected.*WORKER_STOPPED"
                          r"|Failed to load model|ModuleNotFoundError|Traceback)")
DIED = re.compile(r"Backend worker process died")
FAILURES_BEFORE_GIVING_UP = 2  # TorchServe retries a failing worker forever; twice is a verdict
ARCHIVE_UNREADABLE = re.compile(r"Failed to load model: (\S+)\s*\n([^\n]+)")
REFUSAL = "REFUSING TO SERVE:"  # what the handler logs when the artifact's sha256 differs
BIND_FAILURE = re.compile(r"Failed to bind to address (\S+)")
FRONTEND_LOG, WORKER_LOG = "ts_log.log", "model_log.log"  # what our log4j2.xml writes in LOG_LOCATION


def load_failure(log_dir: Path) -> str | None:
    """The handler's error once workers have failed to load more than once, or the archive TorchServe could not
    open; None while nothing says the model will not load."""
    model_log, frontend = log_dir / WORKER_LOG, log_dir / FRONTEND_LOG
    text = _text(frontend)
    unreadable = ARCHIVE_UNREADABLE.search(text)
    if unreadable:  # the frontend could not even open the archive (truncated, not a zip): no worker will start
        return (f"TorchServe could not open {unreadable.group(1)}: {unreadable.group(2).strip()}; "
                "rebuild it with `python -m export`")
    # The frontend logs "Load model failed" in ts_log.log, a dying worker says so in model_log.log (our log4j2.xml
    # keeps worker lines out of ts_log.log, where TorchServe's own configuration copied them).
    died = len(re.findall("Load model failed", text)) + len(DIED.findall(_text(model_log)))
    if died < FAILURES_BEFORE_GIVING_UP:
        return None
    return (_refusal(model_log) or _last_exception(model_log) or _last_matching(frontend) or _last_matching(model_log)
            or f"see {log_dir}")


def exit_reason(log_dir: Path) -> str:
    """Why TorchServe stopped or never answered, from the most specific log that says so."""
    return (_bind_failure(log_dir / "console.log") or _last_exception(log_dir / WORKER_LOG)
            or _last_matching(log_dir / FRONTEND_LOG) or _last_matching(log_dir / WORKER_LOG)
            or _tail(log_dir / "console.log")
            or f"see logs in {log_dir}")


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""  # not written yet: nothing said so far


def _messages(path: Path) -> list[str]:
    """The log's lines without TorchServe's timestamp/logger prefix."""
    return [line.split(" - ", 1)[-1].strip() for line in _text(path).splitlines()]


def _refusal(path: Path) -> str | None:
    """The handler's one-line refusal (a tampered or truncated archive), when it logged one."""
    refusals = [line for line in _messages(path) if line.startswith(REFUSAL)]
    return refusals[-1] if refusals else None


def _last_exception(path: Path) -> str | None:
    errors = [line for line in _messages(path) if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", line)]
    return errors[-1] if errors else None


def _last_matching(path: Path) -> str | None:
    matches = [line.strip() for line in _text(path).splitlines() if LOAD_FAILURE.search(line)]
    return matches[-1][-300:] if matches else None


def _bind_failure(path: Path) -> str | None:
    match = BIND_FAILURE.search(_text(path))
    return f"port in use: {match.group(1)} (stop what holds it or choose other ports)" if match else None


def _tail(path: Path, lines: int = 3) -> str | None:
    return " | ".join(_text(path).strip().splitlines()[-lines:]) or None
