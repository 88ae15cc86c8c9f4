"""Concurrent requests answered as one batch by the core, for engines that hand us one request at a time
(KServe's ModelServer has no batcher of its own in Python: its batcher is the Go agent's, in a cluster only).

The model's serving policy decides (contract/policy.py): on a GPU, up to GPU_BATCH_SIZE rows within
GPU_BATCH_DELAY_MS of the first; on a CPU, batch size 1: each request runs alone, at once. Either way one
thread runs the core in each worker process, as a TorchServe worker does: batches never overlap inside a
worker, so the worker's thread budget (cores / workers) holds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Sequence

from contract.policy import ServingPolicy
from handlers.core import ImageClassifierCore, ImageRequest


class Batcher:
    def __init__(self, core: ImageClassifierCore, policy: ServingPolicy):
        self.core = core
        self.size = policy.batch_size  # rows per batch at most; 1: no batching
        self.delay_ms = policy.max_batch_delay_ms  # how long the first request of a batch waits for others
        self.executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="core")
        self.queue: asyncio.Queue | None = None  # made in the event loop that serves (a spawned worker's own)
        self.collector: asyncio.Task | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    async def answer(self, rows: Sequence[ImageRequest]) -> list:
        """Each row's answer dict or RequestError, in order."""
        if self.size <= 1:
            return await self._run(list(rows))
        if self.loop is not asyncio.get_running_loop():  # a queue and its collector belong to one event loop
            self.loop = asyncio.get_running_loop()
            self.queue = asyncio.Queue()
            self.collector = asyncio.create_task(self._collect())
        answered = asyncio.get_running_loop().create_future()
        self.queue.put_nowait((list(rows), answered))
        return await answered

    async def _run(self, rows: list[ImageRequest]) -> list:
        loop = asyncio.get_running_loop()
        return (await loop.run_in_executor(self.executor, self.core.run_batch, rows)).answers

    async def _collect(self) -> None:
        while True:
            waiting = await self._next_batch()
            rows = [row for request_rows, _ in waiting for row in request_rows]
            try:
                answers = await self._run(rows)
            except Exception as error:  # the core answers bad rows itself; this is our bug: every request gets it
                for _, answered in waiting:
                    answered.set_exception(error)
                continue
            start = 0
            for request_rows, answered in waiting:
                answered.set_result(answers[start:start + len(request_rows)])
                start += len(request_rows)

    async def _next_batch(self) -> list[tuple[list, asyncio.Future]]:
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
