"""A model's inference workers under KServe (`--workers N`, N > 1): N processes the server process spawns, each
opening its own copy of the archive's artifact through the request core (sha256-checked there) with the policy's
thread budget, as TorchServe's workers do. The server process is KServe's HTTP front (one uvicorn, v1, v2 and
the description route): it reads each request, and its batcher (handlers/batching.py) hands each batch to a
free worker, the one idle longest first, so requests spread over the workers whatever the client's connection
count. Before, each KServe worker process listened on its own SO_REUSEPORT socket and kept the keep-alive
connections the kernel hashed to it: with 8 of hey's connections and 2 workers, all of them landed on one
worker in one run of six (docs/results/2026-11-25-serving-overhead/analysis.md, docs/results/2026-11-26-kserve-balance/).

A worker (serving/kserve/inference_worker.py) gets the batch's rows (image bytes and options,
handlers.core.ImageRequest) and answers each row's answer dict or its RequestError, as the core in process would.
A worker that dies is logged at once and replaced (its index kept); the batch it was answering gets a 500 that
names it, the others go on.

The pool keeps a spare: a process spawned once the pool has all its workers, which has done a worker's imports
(torch and the core: most of a new worker's seconds) and waits to be told its placement (inference_worker.Placement:
the folder, device, handler settings, policy and served name to open, and the index it serves as), so that it only
opens the model. It takes a dead worker's place (a new spare is spawned once it serves), or it is lent: a rollout's
candidate beside the live version (serving/kserve/versions.py) opens its pool with the live pool as lender, and
the lent spare, told the candidate's placement, is the candidate's first worker. The candidate serves as soon as
that one is ready; its other workers are spawned then and join as each is ready, and only once it has them all do
the lender and the candidate spawn their spares: no spare's start competes for the cores with the candidate's.
Without a spare alive to lend, the candidate spawns every worker at once, as the server's start does.

A replacement, or a candidate's worker joining, that cannot start (RESTART_TRIES in a row) breaks the pool:
logged, requests waiting for a worker answered 503; a pool the server serves by (essential) then stops the
server, which exits non-zero (serving/kserve/worker.py) rather than hang, while a rollout's candidate beside it
(not essential) only fails its own requests and the live version serves on. On exit (SIGTERM: KServe's uvicorn
drains its requests, then the process exits), each worker is told to stop and joined; a worker whose front is
gone (SIGKILL) reads the end of its pipe and exits.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import signal
import threading
from collections import Counter, deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path

from contract.errors import VisionExportError
from contract.policy import ServingPolicy
from handlers import metrics
from handlers.request_error import RequestError
from serving.kserve.inference_worker import FAILED, REFUSED, Placement, from_wire, worker_main

logger = logging.getLogger("serving.kserve")

RESTART_TRIES = 3  # starts of a worker (a dead one's replacement, a joining one) before the pool gives up
WATCH_S = 1.0  # how often the watcher looks again for workers started since
STOP_S = 10  # how long a worker told to stop may take before it is terminated
SPARE = 0  # a spare's index until it is told its placement
FIRST = 1  # the index of a candidate's worker that the lender's spare becomes


class WorkerExited(VisionExportError):
    """A worker process that exited before it said whether it serves (killed, or a bug: its traceback is logged)."""


@dataclass
class PoolAnswers:
    """A batch's answers (as the core's BatchResult has them) and which worker gave them."""
    answers: list
    worker: str  # "worker 2 pid 4242"


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
        self.workers: dict[int, Worker] = {}  # index -> the worker serving now (absent while one starts)
        self.spare: Worker | None = None  # a worker process with its imports done, for the next place (hand_over_spare)
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
    def open(cls, name: str, folder: Path, device: str, settings: dict | None, policy: ServingPolicy,
             lender: WorkerPool | None = None) -> WorkerPool:
        """A started pool. With a lender (the live version's pool: this one is a rollout's candidate beside it, not
        essential), the lender's spare becomes its first worker."""
        pool = cls(name, folder, device, settings, policy)
        pool.essential = lender is None  # a candidate whose workers break only fails its own requests
        pool.start(lender)
        return pool

    def placement(self, index: int) -> Placement:
        return Placement(index, self.folder, self.device, self.settings, self.policy, self.model)

    def start(self, lender: WorkerPool | None = None) -> None:
        """Serve once the first workers are ready (the lender's spare, or every worker spawned at once); the others
        join as each is ready, then the spares are renewed. A refusal (the core's reason, its exit code) stops the
        workers started and is raised."""
        try:
            first = self._opened_first(lender)
        except BaseException:
            if lender is not None:
                lender.renew_spare()
            raise
        with self.lock:
            self.workers = {worker.index: worker for worker in first}
            self.idle.extend(first)
        atexit.register(self.close)  # before multiprocessing's own exit handler (atexit runs the last first)
        threading.Thread(target=self._watch, name=f"{self.model}-workers", daemon=True).start()
        logger.info("%s: %d of %d inference workers serve (pids %s), batches to the one free longest", self.model,
                    len(first), self.lanes, ", ".join(str(worker.process.pid) for worker in first))
        joining = range(len(first) + 1, self.lanes + 1)
        threading.Thread(target=self._fill, args=(joining, lender), name=f"{self.model}-joining", daemon=True).start()

    def _opened_first(self, lender: WorkerPool | None) -> list[Worker]:
        """The first workers, ready: the lender's spare told worker FIRST's placement, else (none alive to lend,
        or the one lent exited before it was ready) every worker spawned at once."""
        borrowed = lender.hand_over_spare(self.placement(FIRST)) if lender is not None else None
        if borrowed is not None:
            logger.info("%s: the live version's spare (pid %d) opens this one as its worker %d", self.model,
                        borrowed.process.pid, FIRST)
            try:
                self._await_all([borrowed])
                return [borrowed]
            except WorkerExited as error:
                logger.warning("%s; spawning every worker instead", error)
        started = [self._spawn(index) for index in range(FIRST, self.lanes + 1)]
        self._await_all(started)
        return started

    def _await_all(self, workers: list[Worker]) -> None:
        """Each worker ready; a refusal or an exit stops them all and is raised."""
        try:
            for worker in workers:
                self._await_ready(worker)
        except BaseException:
            self._stop_processes(workers)
            raise

    def _fill(self, indices: range, lender: WorkerPool | None) -> None:
        """The workers after the first ones, spawned at once, each serving as soon as it is ready; then, the pool's
        start over, the lender's spare renewed and this pool's own spawned: neither competes with the start for
        the cores."""
        for worker in [self._spawn(index) for index in indices]:
            self._bring_in(worker.index, worker)
        if lender is not None:
            lender.renew_spare()
        self.renew_spare()

    def _spawn(self, index: int) -> Worker:
        """Worker index's process, or a spare's (SPARE: it is told its placement when it takes a place)."""
        ours, theirs = self.context.Pipe()
        placement = None if index == SPARE else self.placement(index)
        process = self.context.Process(target=worker_main, name=f"{self.model}-worker-{index}", daemon=True,
                                       args=(placement, theirs))
        process.start()
        theirs.close()
        return Worker(index, process, ours)

    def _await_ready(self, worker: Worker) -> None:
        wait([worker.conn, worker.process.sentinel])
        message = self._receive(worker)
        if message is None:
            raise WorkerExited(f"{self.model}: inference {worker.name} exited with code {worker.exit_code()} "
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
        self._bring_in(index, self.hand_over_spare(self.placement(index)), replacing=True)
        self.renew_spare()

    def _bring_in(self, index: int, worker: Worker | None, replacing: bool = False) -> None:
        """Worker index serving once ready: the one given (a spare told its place, or one spawned), else one
        spawned, RESTART_TRIES starts in all; none ready breaks the pool."""
        reason = ""
        for _ in range(RESTART_TRIES):
            if self.closing:
                break
            worker = worker or self._spawn(index)
            try:
                self._await_ready(worker)
            except VisionExportError as error:
                reason = str(error)
                self._stop_processes([worker])
                worker = None
                continue
            self._serve_with(worker, replacing)
            return
        if worker is not None:
            self._stop_processes([worker])
        if not self.closing:
            self._fail(f"{self.model}: inference worker {index} could not be started{' again' if replacing else ''} "
                       f"({RESTART_TRIES} tries): {reason}")

    def _serve_with(self, worker: Worker, replacing: bool) -> None:
        """The ready worker takes batches, unless the pool is closing (then it is stopped)."""
        with self.lock:
            serving = not self.closing
            if serving:
                self.workers[worker.index] = worker
                self.restarts[worker.index] += replacing
                self.idle.append(worker)
                self.lock.notify()
        if not serving:
            self._stop_processes([worker])
        elif replacing:
            logger.info("%s: inference %s serves in place of the one that exited", self.model, worker.name)
        else:
            logger.info("%s: inference %s joined", self.model, worker.name)

    def hand_over_spare(self, placement: Placement) -> Worker | None:
        """The spare, told its placement (this pool's dead worker's, or the first worker's of a candidate's pool
        that borrows it), no longer this pool's; None when there is none alive. renew_spare spawns the next."""
        with self.lock:
            if self.closing:  # close() stops the spare
                return None
            spare, self.spare = self.spare, None
        if spare is None:
            return None
        why = "it had exited"
        try:
            if spare.process.is_alive():
                spare.conn.send(placement)
                spare.index = placement.index
                return spare
        except OSError as error:  # it died meanwhile
            why = f"it could not be told ({error})"
        logger.warning("%s: %s cannot take worker %d's place, %s (exit code %s): a new worker starts instead",
                       self.model, spare.name, placement.index, why, spare.exit_code())
        spare.conn.close()
        return None

    def renew_spare(self) -> None:
        """A spare, unless the pool has one, is closing or broken (spawned under the lock: close() then stops it
        too)."""
        with self.lock:
            if self.spare is None and not self.closing and self.broken is None:
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
