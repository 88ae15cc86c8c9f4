"""Concurrent requests answered as one batch by the core, for engines that hand us one request at a time
(KServe's ModelServer has no batcher of its own in Python: its batcher is the Go agent's, in a cluster only).

The model's serving policy decides (contract/policy.py): on a GPU, up to GPU_BATCH_SIZE rows within
GPU_BATCH_DELAY_MS of the first; on a CPU, batch size 1: each request runs alone, at once. Either way one
thread runs the core in each worker process, as a TorchServe worker does: batches never overlap inside a
worker, so the worker's thread budget (cores / workers) holds.

`lanes` is how many batches may run at once: 1 for a core in this process (Ray's replicas, KServe with one
worker); the worker count for a pool that runs each batch in one of its worker processes (serving/kserve/pool.py:
its run_batch blocks until the worker it chose answers). As TorchServe's frontend does, a batch is formed only
when a lane is free, one batch at a time, so a worker that is free takes the next batch whichever connection
its requests came on.

Each request's wait, from its arrival here to the start of its batch on a lane (the batch delay, and any wait
for a free lane), is the queue stage of handlers/metrics.py: one observation per request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from functools import cached_property
from typing import TYPE_CHECKING, Any, Sequence

from contract.policy import ServingPolicy
from handlers import metrics
from handlers.request import ImageRequest

if TYPE_CHECKING:  # torch comes with the core: a process that only makes a deployment (Ray's driver) needs none
    from handlers.core import ImageCore


class Batcher:
    def __init__(self, core: ImageCore | Any, policy: ServingPolicy, lanes: int = 1):
        self.core = core  # run_batch(rows) -> .answers (and .worker: which worker process answered, if any)
        self.size = policy.batch_size  # rows per batch at most; 1: no batching
        self.delay_ms = policy.max_batch_delay_ms  # how long the first request of a batch waits for others
        self.lanes = lanes
        self.executor = concurrent.futures.ThreadPoolExecutor(lanes, thread_name_prefix="core")
        self.queue: asyncio.Queue | None = None  # made in the event loop that serves (a spawned worker's own)
        self.forming: asyncio.Lock | None = None  # one batch is formed at a time, by a free lane
        self.collectors: list[asyncio.Task] = []
        self.loop: asyncio.AbstractEventLoop | None = None

    async def answer(self, rows: Sequence[ImageRequest]) -> list:
        """Each row's answer dict or RequestError, in order."""
        return (await self.answered(rows))[0]

    async def answered(self, rows: Sequence[ImageRequest]) -> tuple[list, Any]:
        """answer()'s list, and which worker answered (the core's result's `worker`; None without one)."""
        arrived = time.perf_counter()
        if self.size <= 1:
            return await self._run(list(rows), [arrived])
        if self.loop is not asyncio.get_running_loop():  # a queue and its collectors belong to one event loop
            self.loop = asyncio.get_running_loop()
            self.queue = asyncio.Queue()
            self.forming = asyncio.Lock()
            self.collectors = [asyncio.create_task(self._collect()) for _ in range(self.lanes)]
        answered = asyncio.get_running_loop().create_future()
        self.queue.put_nowait((list(rows), answered, arrived))
        return await answered

    async def _run(self, rows: list[ImageRequest], arrivals: list[float]) -> tuple[list, Any]:
        """The batch on a free lane; each of its requests' wait (from `arrivals`) recorded as the lane starts it."""

        def started() -> Any:
            begun = time.perf_counter()
            for arrived in arrivals:
                metrics.observe_queue(self.served, begun - arrived)
            return self.core.run_batch(rows)

        result = await asyncio.get_running_loop().run_in_executor(self.executor, started)
        return result.answers, getattr(result, "worker", None)

    @cached_property
    def served(self) -> metrics.ServedModel:
        """The labels of the queue's observations: the core's, or a worker pool's description."""
        return getattr(self.core, "served", None) or metrics.ServedModel.of(self.core.describe())

    async def _collect(self) -> None:
        """One lane: the next batch once this lane is free, run, each request given its rows' answers."""
        while True:
            async with self.forming:
                waiting = await self._next_batch()
            rows = [row for request_rows, _, _ in waiting for row in request_rows]
            try:
                answers, worker = await self._run(rows, [arrived for _, _, arrived in waiting])
            except Exception as error:  # the core answers bad rows itself; a worker that died, or our bug
                for _, answered, _ in waiting:
                    if not answered.done():
                        answered.set_exception(error)
                continue
            start = 0
            for request_rows, answered, _ in waiting:
                if not answered.done():  # its client may have gone
                    answered.set_result((answers[start : start + len(request_rows)], worker))
                start += len(request_rows)

    async def _next_batch(self) -> list[tuple[list, asyncio.Future, float]]:
        """The first waiting request, and whatever else arrives within the delay, up to the batch size."""
        waiting = [await self.queue.get()]
        count = len(waiting[0][0])
        deadline = asyncio.get_running_loop().time() + self.delay_ms / 1000
        while count < self.size:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                break
            try:
                waiting.append(await asyncio.wait_for(self.queue.get(), remaining))
            except asyncio.TimeoutError:
                break
            count += len(waiting[-1][0])
        return waiting
