"""What a client waited, from the engine's own record of each request at its front door (docs/observability.md).

Our request histogram starts where our code first sees a request: behind TorchServe's Java frontend (its queue of
jobs waiting for a worker) and behind Ray Serve's proxy. Both engines log every request they answer with the time
it took at their front: TorchServe's access log (`"POST /predictions/NAME HTTP/1.1" 200 35`, whole ms) and Serve's
proxy log (`-- POST /predictions/NAME 200 53.1ms`). A follower reads the new lines of those files as they are
written and records each prediction in vision_front_request_duration_seconds{model,code}, model as the URL names
it (the name it is served under). KServe's front is our own middleware: it records the same histogram itself.
"""

from __future__ import annotations

import glob
import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from handlers import metrics

logger = logging.getLogger("serving.front")

FOLLOW_S = 0.25  # how often the follower looks for new lines: well under a scrape interval

# The name a prediction's URL gives the model: /predictions/NAME[/VERSION]
_PREDICTION = r"/predictions/(?P<model>[^/?\s]+)\S*"
FORMATS = {
    # TorchServe's ACCESS_LOG (serving/torchserve/log4j2.xml): the frontend's whole-ms time, truncated
    "torchserve": re.compile(r'"POST ' + _PREDICTION + r' HTTP/[\d.]+" (?P<code>\d{3}) (?P<ms>\d+)\s*$'),
    # Ray Serve's proxy log (RUN_DIR/ray/session_latest/logs/serve/proxy_*.log), 0.1 ms
    "ray": re.compile(r" -- POST " + _PREDICTION + r" (?P<code>\d{3}) (?P<ms>[\d.]+)ms\s*$"),
}
WHOLE_MS = {"torchserve"}  # formats that truncate to whole ms: recorded at the middle of that ms


@dataclass(frozen=True)
class FrontRecord:
    model: str
    code: int
    seconds: float


def parse(line: str, form: str) -> FrontRecord | None:
    """One prediction the engine's front answered, or None for any other line (management, metrics, a start-up)."""
    found = FORMATS[form].search(line)
    if found is None:
        return None
    ms = float(found["ms"]) + (0.5 if form in WHOLE_MS else 0.0)
    return FrontRecord(found["model"], int(found["code"]), ms / 1000)


class _File:
    """One log file read from where it ended when the follower first saw it (earlier runs' lines are not this
    process's), from its start when it appears later or is rolled over (a new inode, or shorter than was read)."""

    def __init__(self, path: str, from_end: bool) -> None:
        self.path, self.inode, self.offset, self.rest = path, None, 0, b""
        stat = _stat(path)
        if stat is not None and from_end:
            self.inode, self.offset = stat.st_ino, stat.st_size

    def new_lines(self) -> list[str]:
        stat = _stat(self.path)
        if stat is None:
            return []
        if stat.st_ino != self.inode or stat.st_size < self.offset:
            self.inode, self.offset, self.rest = stat.st_ino, 0, b""
        if stat.st_size == self.offset:
            return []
        with open(self.path, "rb") as file:
            file.seek(self.offset)
            data = file.read(stat.st_size - self.offset)
        self.offset += len(data)
        *lines, self.rest = (self.rest + data).split(b"\n")
        return [line.decode("utf-8", "replace") for line in lines]


def _stat(path: str):
    try:
        return Path(path).stat()
    except OSError:
        return None


class FrontFollower:
    """Follows every file matching `pattern` (a glob: Ray has a proxy log per node) and records what it reads."""

    def __init__(self, pattern: str | Path, form: str, models: list[str]) -> None:
        if form not in FORMATS:
            raise ValueError(f"no front log format {form!r}: one of {', '.join(FORMATS)}")
        self.pattern, self.form, self.models = str(pattern), form, frozenset(models)
        self.files = {path: _File(path, from_end=True) for path in glob.glob(self.pattern)}
        self.stopped = threading.Event()

    def poll(self) -> int:
        """Reads what was written since the last poll; the number of predictions recorded."""
        for path in glob.glob(self.pattern):
            self.files.setdefault(path, _File(path, from_end=False))
        recorded = 0
        for file in self.files.values():
            for line in file.new_lines():
                record = parse(line, self.form)
                if record is not None:  # a name nobody serves is no label of its own (no unbounded series)
                    model = record.model if record.model in self.models else metrics.UNKNOWN_MODEL
                    metrics.observe_front(model, record.code, record.seconds)
                    recorded += 1
        return recorded

    def start(self) -> FrontFollower:
        threading.Thread(target=self._run, name="front-follower", daemon=True).start()
        logger.info("recording the front's time of each prediction from %s (%s)", self.pattern, self.form)
        return self

    def stop(self) -> None:
        self.stopped.set()

    def _run(self) -> None:
        while not self.stopped.wait(FOLLOW_S):
            try:
                self.poll()
            except OSError as error:  # a file rolled over between stat and open: read again on the next poll
                logger.warning("front log %s: %s", self.pattern, error)
