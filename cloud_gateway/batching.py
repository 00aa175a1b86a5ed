"""Dynamic batching: concurrent requests for one model run as one batch.

Requests wait in a queue; when the runner is free, :func:`plan_batch` (pure:
the queue's sizes, ages and deadlines and the clock are passed in) decides
which of them run together: requests with the same non-batch shapes, oldest
first, up to ``max_batch_size`` rows. A batch goes at once when it is full or
reaches a preferred size, otherwise when its oldest request has waited
``max_queue_delay_us``. With a delay of 0 the batcher still batches whatever
arrived while the previous batch ran, at no added latency.

``busy_delay_us`` is a wait that only concurrent clients pay: while the model's
last batch held several requests, a smaller batch waits up to that long for as
many rows as the last one had. Where the front end and the runtime share a few
cores, running every small batch at once costs the runtime's per-batch overhead
again and again and takes CPU from the front end (measured on 2 cores with the
wide MLP and 64 gRPC clients: about a third of the gateway's CPU a request);
a lone client, whose last batch was itself, never waits.

Each request keeps its own deadline: one that expires in the queue is failed
alone and never run. Inputs are validated before they are queued, so a bad
input fails only its own request; if a batch still fails in the runtime, its
requests are re-run one by one so that only the culprit fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from cloud_gateway.config import BatchingSettings
from edge_core.errors import DeadlineExceeded, Unavailable

__all__ = ["DynamicBatcher", "Plan", "Queued", "plan_batch"]

log = logging.getLogger(__name__)

Array = np.ndarray[Any, Any]
Runner = Callable[[dict[str, Array]], dict[str, Array]]


@dataclass(frozen=True)
class Queued:
    """What planning needs to know of one queued request."""

    rows: int
    key: Hashable
    enqueued: float
    deadline: float | None = None


@dataclass(frozen=True)
class Plan:
    expired: list[int] = field(default_factory=list)  # queue positions to fail now
    take: list[int] = field(default_factory=list)  # queue positions to run now, in order
    wake_at: float | None = None  # when to plan again if nothing changes


def plan_batch(
    queue: Sequence[Queued], now: float, config: BatchingSettings, last: tuple[int, int] = (0, 0)
) -> Plan:
    """Decide what to run now, what has expired and when to look again. Pure.

    ``last`` is the previous batch's (requests, rows): with ``busy_delay_us``, a batch
    waits for as many rows as it had while it held more than one request.
    """
    expired = [i for i, q in enumerate(queue) if q.deadline is not None and q.deadline <= now]
    gone = set(expired)
    live = [i for i in range(len(queue)) if i not in gone]
    if not live:
        return Plan(expired=expired)
    head = queue[live[0]]
    take: list[int] = []
    rows = 0
    sums: list[int] = []
    full = False
    for i in live:
        item = queue[i]
        if item.key != head.key:
            continue
        if take and rows + item.rows > config.max_batch_size:
            full = True
            break
        take.append(i)
        rows += item.rows
        sums.append(rows)
        if rows >= config.max_batch_size:
            full = True
            break
    delay_us = config.max_queue_delay_us
    if config.busy_delay_us and last[0] > 1 and rows < min(last[1], config.max_batch_size):
        delay_us = max(delay_us, config.busy_delay_us)
    due = head.enqueued + delay_us / 1e6
    if full or now >= due:
        return Plan(expired=expired, take=take)
    target = max((p for p in config.preferred_batch_sizes if p <= rows), default=None)
    if target is not None and target in sums:
        return Plan(expired=expired, take=take[: sums.index(target) + 1])
    deadlines = [queue[i].deadline for i in live if queue[i].deadline is not None]
    wake = min([due, *[d for d in deadlines if d is not None]])
    return Plan(expired=expired, wake_at=wake)


@dataclass
class _Item:
    feed: dict[str, Array]
    meta: Queued
    future: asyncio.Future[dict[str, Array]]


class DynamicBatcher:
    """The queue and runner of one model. Lives on one event loop.

    ``on_batch(rows, queue_seconds_list, compute_seconds)`` is called after each
    batch, for metrics. Up to ``max_inflight`` batches are out at once, running
    or waiting for a free thread of ``executor``; batchers that share an executor
    share ``slots`` (a semaphore) instead.
    """

    def __init__(
        self,
        runner: Runner,
        config: BatchingSettings,
        executor: Executor,
        *,
        name: str = "",
        on_batch: Callable[[int, list[float], float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_inflight: int = 1,
        slots: asyncio.Semaphore | None = None,
    ) -> None:
        self.config = config
        self.name = name
        self._runner = runner
        self._executor = executor
        self._on_batch = on_batch
        self._clock = clock
        self._queue: list[_Item] = []
        self._wakeup = asyncio.Event()
        self._slots = slots or asyncio.Semaphore(max_inflight)
        self._tasks: set[asyncio.Task[None]] = set()
        self._last = (0, 0)  # the last batch's requests and rows (busy_delay_us)
        self._closed = False
        self._loop_task = asyncio.get_running_loop().create_task(self._loop())
        self._loop_task.add_done_callback(self._loop_ended)

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        log.error("the batcher of %s stopped: %r", self.name, task.exception())
        self._closed = True
        for item in self._queue:  # nothing waits forever on a dead batcher
            self._resolve(item, Unavailable(f"model {self.name} cannot run requests now"))
        self._queue.clear()

    @staticmethod
    def key_of(feed: dict[str, Array]) -> Hashable:
        return tuple((name, array.shape[1:], array.dtype.str) for name, array in feed.items())

    async def submit(
        self, feed: dict[str, Array], deadline: float | None = None
    ) -> dict[str, Array]:
        """Queue one request's validated inputs; its outputs when its batch has run.

        Raises:
            DeadlineExceeded: the deadline passed before the outputs were ready.
            Unavailable: the batcher was closed.
        """
        if self._closed:
            raise Unavailable(f"model {self.name} is being unloaded")
        rows = next(iter(feed.values())).shape[0]
        future: asyncio.Future[dict[str, Array]] = asyncio.get_running_loop().create_future()
        meta = Queued(rows, self.key_of(feed), self._clock(), deadline)
        self._queue.append(_Item(feed, meta, future))
        self._wakeup.set()
        if deadline is None:
            return await future
        try:
            return await asyncio.wait_for(future, max(deadline - self._clock(), 0.0))
        except asyncio.TimeoutError:
            raise DeadlineExceeded(
                f"the request's deadline passed while it waited for model {self.name}"
            ) from None

    async def _loop(self) -> None:
        while True:
            # a slot only once there is work: an idle model holding one of the slots
            # that all models share would starve the others (more models than slots)
            if not await self._work():
                return
            await self._slots.acquire()
            batch = await self._next_batch()
            if batch is None:
                self._slots.release()
                return
            task = asyncio.get_running_loop().create_task(self._execute(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _work(self) -> bool:
        """Wait until a request is queued; ``False`` when closed with nothing queued."""
        while True:
            self._queue = [item for item in self._queue if not item.future.done()]
            if self._queue:
                return True
            if self._closed:
                return False
            self._wakeup.clear()
            await self._wakeup.wait()

    async def _next_batch(self) -> list[_Item] | None:
        while True:
            self._queue = [item for item in self._queue if not item.future.done()]
            if self._closed and not self._queue:
                return None
            # while closing, what is queued goes at once
            config = (
                replace(self.config, max_queue_delay_us=0, busy_delay_us=0)
                if self._closed
                else self.config
            )
            queue = [item.meta for item in self._queue]
            plan = plan_batch(queue, self._clock(), config, self._last)
            for index in plan.expired:
                item = self._queue[index]
                if not item.future.done():
                    item.future.set_exception(
                        DeadlineExceeded(
                            "the request's deadline passed while it was queued "
                            f"for model {self.name}"
                        )
                    )
            if plan.take:
                batch = [self._queue[i] for i in plan.take]
                taken = set(plan.take) | set(plan.expired)
                self._queue = [item for i, item in enumerate(self._queue) if i not in taken]
                self._last = (len(batch), sum(item.meta.rows for item in batch))
                return batch
            if plan.expired:
                continue
            self._wakeup.clear()
            timeout = None if plan.wake_at is None else max(plan.wake_at - self._clock(), 0.0)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout)

    async def _execute(self, batch: list[_Item]) -> None:
        try:
            await self._run_batch(batch)
        except Exception as exc:  # whatever went wrong, no request of the batch is left waiting
            log.exception("a batch of %s failed", self.name)
            for item in batch:
                self._resolve(item, exc)
        finally:
            self._slots.release()

    def _timed(self, feed: dict[str, Array]) -> tuple[dict[str, Array], float, float]:
        """Run a batch in the executor's thread; when it started and ended there (a
        batch may wait for a free thread first: that is queue time, not compute)."""
        started = self._clock()
        outputs = self._runner(feed)
        return outputs, started, self._clock()

    async def _run_batch(self, batch: list[_Item]) -> None:
        loop = asyncio.get_running_loop()
        names = list(batch[0].feed)
        if len(batch) == 1:
            feed = batch[0].feed
        else:
            feed = {n: np.concatenate([item.feed[n] for item in batch]) for n in names}
        try:
            outputs, started, ended = await loop.run_in_executor(self._executor, self._timed, feed)
        except Exception as exc:
            if len(batch) == 1:
                self._resolve(batch[0], exc)
                return
            log.warning(
                "a batch of %d for %s failed (%s); re-running one by one",
                len(batch),
                self.name,
                exc,
            )
            for item in batch:
                try:
                    self._resolve(
                        item,
                        await loop.run_in_executor(self._executor, self._runner, item.feed),
                    )
                except Exception as single:
                    self._resolve(item, single)
            return
        compute = ended - started
        waits = [started - item.meta.enqueued for item in batch]
        offset = 0
        for item in batch:
            end = offset + item.meta.rows
            self._resolve(item, {n: v[offset:end] for n, v in outputs.items()})
            offset = end
        if self._on_batch is not None:
            self._on_batch(offset, waits, compute)

    @staticmethod
    def _resolve(item: _Item, result: dict[str, Array] | BaseException) -> None:
        if item.future.done():
            return
        if isinstance(result, BaseException):
            item.future.set_exception(result)
        else:
            item.future.set_result(result)

    async def close(self) -> None:
        """Stop taking requests, run those already queued, then stop."""
        self._closed = True
        self._wakeup.set()
        await self._loop_task
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
