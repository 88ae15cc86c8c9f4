"""The run's progress on stderr: photos done of the total, error rows, photos per second and the time left. On a
terminal one line redrawn in place; in a log (a scheduled run) a line every LOG_EVERY_S seconds."""

from __future__ import annotations

import sys
import time

REDRAW_EVERY_S = 0.5
LOG_EVERY_S = 30.0


class Progress:
    def __init__(self, total: int, stream=None):
        self.total = total
        self.stream = stream or sys.stderr
        self.terminal = self.stream.isatty()
        self.started = self.shown = time.monotonic()
        self.done = self.failed = 0
        self.shown_done = -1  # what the last line showed

    def update(self, done: int, failed: int) -> None:
        self.done, self.failed = done, failed
        now = time.monotonic()
        if now - self.shown >= (REDRAW_EVERY_S if self.terminal else LOG_EVERY_S):
            self.shown = now
            self.show()

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.done / elapsed
        left = (self.total - self.done) / rate if rate else None
        share = 100 * self.done / self.total if self.total else 100.0
        return (
            f"{self.done}/{self.total} photos ({share:.0f} %), {self.failed} error rows, {rate:.1f} photos/s, "
            f"{'ETA ' + duration(left) if left is not None else 'ETA unknown'}, {duration(elapsed)} elapsed"
        )

    def show(self) -> None:
        self.shown_done = self.done
        if self.terminal:
            self.stream.write("\r" + self.line().ljust(100))
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.shown_done != self.done:
            self.show()
        if self.terminal:
            self.stream.write("\n")
        self.stream.flush()


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m{rest % 60:02d}s" if hours else f"{rest // 60}m{rest % 60:02d}s"
