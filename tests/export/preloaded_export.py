"""`python -m export` runs forked from one process that imported the export command once.

A test that starts many short exports (each killed at a chosen step) would spend most of its time importing torch
again; each run here is a child forked from a server that imported `export.commands` and ran nothing yet (no
torch thread pool exists to be copied into a child). The child is a real process running export.cli.main with
its own pid: it can be watched and SIGKILLed like `python -m export`.

Run as a script: reads one request per line on stdin, {"args": [...], "log": file for its stdout and stderr},
answers {"pid": ...} when the run started and {"pid": ..., "status": ...} (os.waitpid's status) when it ended.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _serve() -> None:
    import export.commands  # noqa: F401 - the import each forked run saves
    from export.cli import main
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os._exit(main(request["args"]))
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"pid": pid, "status": status}), flush=True)


class PreloadedExport:
    """The server process; start(args, log) returns the pid of a new run, wait() its os.waitpid status."""

    def __init__(self):
        self.process = subprocess.Popen([sys.executable, __file__], cwd=ROOT, text=True, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})

    def start(self, args: list[str], log: Path) -> int:
        self.process.stdin.write(json.dumps({"args": args, "log": str(log)}) + "\n")
        self.process.stdin.flush()
        return self._answer()["pid"]

    def wait(self) -> int:
        return self._answer()["status"]

    def _answer(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the preloaded export server exited with {self.process.wait()}")
        return json.loads(line)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    _serve()
