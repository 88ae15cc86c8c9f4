"""A batch run on this machine alone (no --address): the serving policy's workers as processes of a standard
process pool, each a Scorer (serving/batch/scoring.py) that reads, decodes and answers its photos with the request
core's whole run_batch, as the endpoint's workers do; the driver gathers the rows into parts (run.py: stream).

No Ray here: on one machine its driver, raylet, object store and decode tasks cost CPU the model's workers would
use, and the endpoint's workers show that decoding in the model's worker keeps every core busy. `--address`
runs on a Ray cluster with Ray Data (run.py: dataset); a GPU machine does too (`--address local` without a
cluster), where Ray gives each actor its own GPU.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, as_completed, wait
from pathlib import Path

from contract.policy import ServingPolicy
from serving.batch.inputs import Shard, photo_items

IN_FLIGHT_PER_WORKER = 2  # calls queued per worker: the next is ready when one ends, memory stays bounded
PARENT_CHECK_S = 1.0  # how soon a worker ends once the driver is gone
_scorer = None  # the pool process's own Scorer, opened once by its initializer


def open_scorer(model_path: str, policy: dict, scratch: str) -> None:
    """The pool process's start: its Scorer, Ctrl-C left to the driver (which stops the pool), and an end of its
    own when the driver dies (a SIGKILL of it must not leave the workers holding their models)."""
    global _scorer
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=end_with_parent, args=(os.getppid(),), daemon=True).start()
    from serving.batch.scoring import Scorer

    _scorer = Scorer(model_path, policy, scratch=scratch)


def end_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(1)


def score_rows(batch: dict) -> dict:
    assert _scorer is not None, "the pool's initializer opens the Scorer"
    return _scorer(batch)


def calls(pending: list[Shard], rows_per_call: int) -> Iterator[dict]:
    """The pending photos in INPUT's order, rows_per_call at a time, as the Scorer takes them (its columns)."""
    items = photo_items(pending)
    for start in range(0, len(items), rows_per_call):
        chunk = items[start : start + rows_per_call]
        yield {name: [item[name] for item in chunk] for name in items[0]}


def answered_locally(
    model_path: Path, pending: list[Shard], policy: ServingPolicy, rows_per_call: int
) -> Iterator[list[dict]]:
    """Each call's output rows as it ends (any order: run.py gathers them by shard), from a pool of the policy's
    workers (spawned: no copy of the driver's threads). A worker that ends a call takes the next at once. The
    archive is unpacked once into the run's scratch folder, removed here when the run ends (workers that are
    terminated clean up nothing of their own)."""
    with tempfile.TemporaryDirectory(prefix="batch-model-") as scratch:
        yield from answered_by_pool(model_path, pending, policy, rows_per_call, scratch)


def answered_by_pool(model_path: Path, pending: list[Shard], policy: ServingPolicy, rows_per_call: int,
                     scratch: str) -> Iterator[list[dict]]:
    pool = ProcessPoolExecutor(
        max_workers=policy.workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=open_scorer,
        initargs=(str(model_path.absolute()), policy.to_dict(), scratch),
    )
    waiting: set[Future] = set()
    try:
        for batch in calls(pending, rows_per_call):
            waiting.add(pool.submit(score_rows, batch))
            if len(waiting) >= IN_FLIGHT_PER_WORKER * policy.workers:
                ended, waiting = wait(waiting, return_when=FIRST_COMPLETED)
                yield from (as_rows(call.result()) for call in ended)
        for call in as_completed(waiting):
            yield as_rows(call.result())
    except BaseException:  # Ctrl-C, or an error: the workers end now rather than after their calls
        for process in list((pool._processes or {}).values()):
            process.terminate()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def as_rows(columns: dict) -> list[dict]:
    names = list(columns)
    return [dict(zip(names, values)) for values in zip(*columns.values())]
