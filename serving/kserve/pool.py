"""A model's inference workers under KServe (`--workers N`, N > 1): N processes the server process spawns, each
opening its own copy of the archive's artifact through the request core (sha256-checked there) with the policy's
thread budget, as TorchServe's workers do. The server process is KServe's HTTP front (one uvicorn, v1, v2 and
the description route): it reads each request, and its batcher (handlers/batching.py) hands each batch to a
free worker, the one idle longest first, so requests spread over the workers whatever the client's connection
count. Before, each KServe worker process listened on its own SO_REUSEPORT socket and kept the keep-alive
connections the kernel hashed to it: with 8 of hey's connections and 2 workers, all of them landed on one
worker in one run of six (docs/results/2026-11-25-serving-overhead/analysis.md, docs/results/2026-11-26-kserve-balance/).

A worker gets the batch's rows (image bytes and options, handlers.core.ImageRequest) and answers each row's
answer dict or its RequestError, as the core in process would. A worker that dies is logged at once and
replaced (its index kept); the batch it was answering gets a 500 that names it, the others go on. The
replacement is the pool's spare when it has one: a process spawned once the workers serve, which has done a
worker's imports (torch and the core: most of a new worker's seconds) and waits to be told whose place it
takes, so that it only opens the model; a new spare is spawned once it serves. A
replacement that cannot start (RESTART_TRIES in a row) breaks the pool: logged, requests waiting for a worker
answered 503; a pool the server serves by (essential) then stops the server, which exits non-zero
(serving/kserve/worker.py) rather than hang, while a rollout's candidate beside it (not essential) only fails its
own requests and the live version serves on. On exit (SIGTERM:
KServe's uvicorn drains its requests, then the process exits), each worker is told to stop and joined; a
worker whose front is gone (SIGKILL) reads the end of its pipe and exits.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import signal
import sys
import threading
from collections import Counter, deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path

from contract.errors import VisionExportError
from contract.policy import ServingPolicy
from handlers import metrics
from handlers.request_error import RequestError

logger = logging.getLogger("serving.kserve")

READY, REFUSED, ANSWERS, FAILED = "ready", "refused", "answers", "failed"  # what a worker sends
ROW_ERROR = "request-error"  # a row's RequestError on the wire: (ROW_ERROR, code, message)
RESTART_TRIES = 3  # starts of a dead worker's replacement before the server gives up and stops
WATCH_S = 1.0  # how often the watcher looks again for workers started since
STOP_S = 10  # how long a worker told to stop may take before it is terminated
SPARE = 0  # the index a spare is spawned with: it learns its own when it takes a dead worker's place


@dataclass
class PoolAnswers:
    """A batch's answers (as the core's BatchResult has them) and which worker gave them."""
    answers: list
    worker: str  # "worker 2 pid 4242"


def to_wire(answers: list) -> list:
    return [(ROW_ERROR, a.code, a.message) if isinstance(a, RequestError) else a for a in answers]


def from_wire(answers: list) -> list:
    return [RequestError(a[1], a[2]) if isinstance(a, tuple) and a[0] == ROW_ERROR else a for a in answers]


def worker_main(index: int, folder: Path, device: str, settings: dict | None, policy: ServingPolicy,
                served_name: str, conn) -> None:
    """A spawned worker: open the core (served under the model's name), say so, then answer each batch until told
    to stop (None) or the front is gone (end of the pipe)."""
    from handlers.logs import configure_logging
    from handlers.opening import open_archive
    configure_logging()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the front stops us; a terminal's Ctrl-C reaches it alone
    if index == SPARE:
        index = standing_by(conn)
    try:
        core = open_archive(folder, device, policy, settings, served_name=served_name)
    except VisionExportError as error:
        conn.send((REFUSED, str(error), error.exit_code))
        return
    conn.send((READY, core.TASK, core.describe()))
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


def standing_by(conn) -> int:
    """A spare's wait, its imports done: the index of the worker whose place it takes; it leaves when told to
    stop (None) or when the front is gone (end of the pipe)."""
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


class Worker:
    def __init__(self, index: int, process, conn):
        self.index, self.process, self.conn = index, process, conn

    @property
    def name(self) -> str:
        return f"{'spare' if self.index == SPARE else f'worker {self.index}'} pid {self.process.pid}"

    def exit_code(self) -> int | None:
        self.process.join(1)
        return self.process.exitcode


class WorkerPool:
    """What the model's batcher runs batches on (handlers/kserve_model.py): run_batch(rows) blocks until a
    worker has answered (one batch per worker at a time: `lanes` batches at once), describe() and TASK as the
    core's."""

    def __init__(self, name: str, folder: Path, device: str, settings: dict | None, policy: ServingPolicy):
        self.model, self.folder, self.device, self.settings, self.policy = name, Path(folder), device, settings, policy
        self.lanes = policy.workers
        self.context = multiprocessing.get_context("spawn")
        self.lock = threading.Condition()
        self.workers: dict[int, Worker] = {}  # index -> the worker serving now (absent while one is replaced)
        self.spare: Worker | None = None  # a worker process with its imports done, for the next dead worker's place
        self.idle: deque[Worker] = deque()  # the free workers, the one free longest first
        self.rows = Counter()  # rows answered, per index
        self.restarts = Counter()  # replacements, per index
        self.closing = False
        self.broken: str | None = None  # why the pool cannot serve any more
        self.essential = True  # the server serves by it: its breaking stops the server (a candidate's does not)
        self.TASK: str | None = None
        self.description: dict = {}

    # ---------------------------------------------------------------- starting
    @classmethod
    def open(cls, name: str, folder: Path, device: str, settings: dict | None, policy: ServingPolicy) -> WorkerPool:
        pool = cls(name, folder, device, settings, policy)
        pool.start()
        return pool

    def start(self) -> None:
        """Spawn every worker and wait until each has opened its copy; a refusal (the core's reason, its exit
        code) stops the others and is raised."""
        started = [self._spawn(index) for index in range(1, self.lanes + 1)]
        try:
            for worker in started:
                self._await_ready(worker)
        except BaseException:
            self._stop_processes(started)
            raise
        with self.lock:
            self.workers = {worker.index: worker for worker in started}
            self.idle.extend(started)
        atexit.register(self.close)  # before multiprocessing's own exit handler (atexit runs the last first)
        threading.Thread(target=self._watch, name=f"{self.model}-workers", daemon=True).start()
        logger.info("%s: %d inference workers (pids %s), batches to the one free longest", self.model, self.lanes,
                    ", ".join(str(w.process.pid) for w in started))
        self._renew_spare()

    def _spawn(self, index: int) -> Worker:
        ours, theirs = self.context.Pipe()
        process = self.context.Process(target=worker_main, name=f"{self.model}-worker-{index}", daemon=True,
                                       args=(index, self.folder, self.device, self.settings, self.policy, self.model,
                                             theirs))
        process.start()
        theirs.close()
        return Worker(index, process, ours)

    def _await_ready(self, worker: Worker) -> None:
        wait([worker.conn, worker.process.sentinel])
        message = self._receive(worker)
        if message is None:
            raise VisionExportError(f"{self.model}: inference {worker.name} exited with code {worker.exit_code()} "
                                    "while opening its model (see the lines above)")
        if message[0] == REFUSED:
            error = VisionExportError(message[1])
            error.exit_code = message[2]
            raise error
        _, self.TASK, self.description = message

    @staticmethod
    def _receive(worker: Worker):
        """The worker's next message, or None when it died (its pipe ended)."""
        try:
            return worker.conn.recv() if worker.conn.poll(0) else None
        except (EOFError, OSError):
            return None

    # ---------------------------------------------------------------- serving
    def run_batch(self, rows: list) -> PoolAnswers:
        while True:
            worker = self._take()
            try:
                worker.conn.send(rows)
            except OSError:  # it died while free: the watcher replaces it, another takes this batch
                continue
            wait([worker.conn, worker.process.sentinel])
            message = self._receive(worker)
            if message is None:
                raise RequestError(500, f"inference {worker.name} died while answering this request (exit code "
                                        f"{worker.exit_code()}); a new worker is starting")
            self._give_back(worker, len(rows))
            if message[0] == FAILED:
                raise RuntimeError(f"inference {worker.name}: {message[1]}")
            return PoolAnswers(from_wire(message[1]), worker.name)

    def _take(self) -> Worker:
        with self.lock:
            while not self.idle and self.broken is None and not self.closing:
                self.lock.wait()
            if self.broken is not None or self.closing:
                raise RequestError(503, self.broken or "the server is stopping")
            return self.idle.popleft()

    def _give_back(self, worker: Worker, rows: int) -> None:
        with self.lock:
            self.rows[worker.index] += rows
            if self.workers.get(worker.index) is worker and worker.process.is_alive():
                self.idle.append(worker)
                self.lock.notify()

    def describe(self) -> dict:
        """The core's description (from the first worker), each worker (pid, rows answered, replacements) and the
        spare's pid (None while there is none)."""
        with self.lock:
            workers = [{"worker": index, "pid": worker.process.pid, "rows": self.rows[index],
                        "restarts": self.restarts[index]} for index, worker in sorted(self.workers.items())]
            spare = self.spare.process.pid if self.spare else None
        return {**self.description, "workers": workers, "spare": spare}

    def not_answering(self) -> str | None:
        """Why no worker can take a batch now (None: one can): what readiness asks (serving/kserve/signals.py)."""
        with self.lock:
            if self.broken is not None:
                return self.broken
            if any(worker.process.is_alive() for worker in self.workers.values()):
                return None
        return "no live inference worker (a new one is starting)"

    # ---------------------------------------------------------------- a worker that dies
    def _watch(self) -> None:
        while True:
            with self.lock:
                if self.closing:
                    return
                watched = {worker.process.sentinel: worker for worker in self.workers.values()}
            for sentinel in wait(list(watched), WATCH_S):
                self._replace(watched[sentinel])

    def _replace(self, dead: Worker) -> None:
        with self.lock:
            if self.closing or self.workers.get(dead.index) is not dead:
                return
            del self.workers[dead.index]
            if dead in self.idle:
                self.idle.remove(dead)
        metrics.process_exited(dead.process.pid)
        logger.error("%s: inference %s exited with code %s: starting a new worker %d", self.model, dead.name,
                     dead.exit_code(), dead.index)
        threading.Thread(target=self._restart, args=(dead.index,), name=f"{self.model}-restart-{dead.index}",
                         daemon=True).start()

    def _restart(self, index: int) -> None:
        reason = ""
        for attempt in range(RESTART_TRIES):
            worker = (self._take_spare(index) if attempt == 0 else None) or self._spawn(index)
            try:
                self._await_ready(worker)
            except VisionExportError as error:
                reason = str(error)
                self._stop_processes([worker])
                continue
            with self.lock:
                serving = not self.closing
                if serving:
                    self.workers[index] = worker
                    self.restarts[index] += 1
                    self.idle.append(worker)
                    self.lock.notify()
            if serving:
                logger.info("%s: inference %s serves in place of the one that exited", self.model, worker.name)
                self._renew_spare()
            else:
                self._stop_processes([worker])
            return
        self._fail(f"{self.model}: inference worker {index} could not be started again ({RESTART_TRIES} tries): "
                   f"{reason}")

    def _take_spare(self, index: int) -> Worker | None:
        """The spare, told to take worker index's place; None when there is none alive."""
        with self.lock:
            spare, self.spare = self.spare, None
        if spare is None:
            return None
        why = "it had exited"
        try:
            if spare.process.is_alive():
                spare.conn.send(index)
                spare.index = index
                return spare
        except OSError as error:  # it died meanwhile
            why = f"it could not be told ({error})"
        logger.warning("%s: %s cannot take worker %d's place, %s (exit code %s): a new worker starts instead",
                       self.model, spare.name, index, why, spare.exit_code())
        spare.conn.close()
        return None

    def _renew_spare(self) -> None:
        """A spare, unless the pool has one or is closing (spawned under the lock: close() then stops it too)."""
        with self.lock:
            if self.spare is None and not self.closing:
                self.spare = self._spawn(SPARE)

    def _fail(self, reason: str) -> None:
        with self.lock:
            self.broken = reason
            self.lock.notify_all()
            essential = self.essential
        if not essential:
            logger.error("%s; its requests are refused, the server serves on", reason)
            return
        logger.error("%s; stopping the server", reason)
        os.kill(os.getpid(), signal.SIGTERM)  # KServe's uvicorn stops as on any SIGTERM; the exit status says why

    # ---------------------------------------------------------------- stopping
    def close(self) -> None:
        """Tell every worker to stop after its batch, join them (terminated past STOP_S)."""
        with self.lock:
            if self.closing:
                return
            self.closing = True
            self.lock.notify_all()
            workers = list(self.workers.values()) + ([self.spare] if self.spare else [])
        self._stop_processes(workers)

    def _stop_processes(self, workers: list[Worker]) -> None:
        for worker in workers:
            try:
                worker.conn.send(None)
            except OSError:
                pass
        for worker in workers:
            worker.process.join(STOP_S)
            if worker.process.is_alive():
                worker.process.terminate()
                worker.process.join(STOP_S)
            worker.conn.close()
