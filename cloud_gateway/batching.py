"""Dynamic batching: concurrent requests for one model run as one batch.

Requests wait in a queue; when the runner is free, :func:`plan_batch` (pure:
the queue's sizes, ages and deadlines and the clock are passed in) decides
which of them run together: requests with the same non-batch shapes, oldest
first, up to ``max_batch_size`` rows. A batch goes at once when it is full or
reaches a preferred size, otherwise when its oldest request has waited
``max_queue_delay_us``. With a delay of 0 the batcher still batches whatever
arrived while the previous batch ran, at no added latency.

``busy_delay_us`` is a wait that only a congested model's requests pay: while
the model's last batch held several requests, a smaller batch whose oldest request
came while a batch of the model was still out waits up to that long for more rows:
twice as many as the last batch had up to 16 (past that, as many as it had), but
never more rows of its shapes than the model held at once (queued, and in batches
out) when its last few batches of them went (:func:`busy_target`).
So a congested model's batches grow towards what its clients have in flight, and
none waits for clients who are not there: where the front end and the runtime share
a few cores, running every small batch at once pays the runtime's per-batch cost
again and again and takes CPU from the front end. A lone client, whose last batch
was itself, never waits; nor does a request that finds the model idle, so that
traffic arriving at random (a fleet's devices) is not held waiting for companions
that rarely come. While a batch waits, a request that cannot end the wait is queued
without planning again. The measurements behind these rules are in
docs/gateway.md (Dynamic batching) and docs/benchmarks/index.md.

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
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from cloud_gateway.config import BatchingSettings
from edge_core.errors import DeadlineExceeded, Unavailable

__all__ = ["BatchSlots", "DynamicBatcher", "Plan", "Queued", "busy_target", "plan_batch"]

log = logging.getLogger(__name__)

HELD_WINDOW = 8  # batches over which busy_target's cap looks back
# busy_delay_us: batches grow to this many rows, where the batcher's own cost a batch
# (the hop to a thread and back, stacking and splitting) is spread thin
GROW_UNTIL = 16

Array = np.ndarray[Any, Any]
Runner = Callable[[dict[str, Array]], dict[str, Array]]


@dataclass(frozen=True)
class Queued:
    """What planning needs to know of one queued request."""

    rows: int
    key: Hashable
    enqueued: float
    deadline: float | None = None
    behind: bool = False  # it came while a batch of its model was out


@dataclass(frozen=True)
class Plan:
    expired: list[int] = field(default_factory=list)  # queue positions to fail now
    take: list[int] = field(default_factory=list)  # queue positions to run now, in order
    wake_at: float | None = None  # when to plan again if nothing changes
    more_rows: int = 0  # or once this many rows more have come (of any shapes)


def plan_batch(
    queue: Sequence[Queued], now: float, config: BatchingSettings, last: tuple[int, int] = (0, 0)
) -> Plan:
    """Decide what to run now, what has expired and when to look again. Pure.

    ``last`` is the previous batch's requests and a number of rows: with
    ``busy_delay_us``, a batch whose oldest request came while the model was busy
    (``Queued.behind``) waits for that many rows while the last batch held more than
    one request (the batcher passes :func:`busy_target`).
    """
    expired = [i for i, q in enumerate(queue) if q.deadline is not None and q.deadline <= now]
    gone = set(expired)
    live = [i for i in range(len(queue)) if i not in gone]
    if not live:
        return Plan(expired=expired)
    head = queue[live[0]]
    take, sums, full = _fill(queue, live, config.max_batch_size)
    rows = sums[-1]
    delay_us, sizes = _delay(head, rows, config, last)
    due = head.enqueued + delay_us / 1e6
    if full or now >= due:
        return Plan(expired=expired, take=take)
    target = max((p for p in config.preferred_batch_sizes if p <= rows), default=None)
    if target is not None and target in sums:
        return Plan(expired=expired, take=take[: sums.index(target) + 1])
    deadlines = [d for d in (queue[i].deadline for i in live) if d is not None]
    sizes += [p for p in config.preferred_batch_sizes if p > rows]
    return Plan(expired=expired, wake_at=min([due, *deadlines]), more_rows=min(sizes) - rows)


def _fill(
    queue: Sequence[Queued], live: list[int], max_rows: int
) -> tuple[list[int], list[int], bool]:
    """The batch of the oldest live request: the live requests of its shapes, oldest
    first, whole, up to ``max_rows``. Their positions, the rows after each, and whether
    the batch is full (no more rows would fit)."""
    key = queue[live[0]].key
    take: list[int] = []
    sums: list[int] = []
    rows = 0
    for i in live:
        item = queue[i]
        if item.key != key:
            continue
        if take and rows + item.rows > max_rows:
            return take, sums, True
        take.append(i)
        rows += item.rows
        sums.append(rows)
        if rows >= max_rows:
            return take, sums, True
    return take, sums, False


def _delay(
    head: Queued, rows: int, config: BatchingSettings, last: tuple[int, int]
) -> tuple[int, list[int]]:
    """How long the batch of ``head`` (``rows`` so far) may wait, in µs, and the sizes
    that, reached, send it sooner: ``max_queue_delay_us``, or ``busy_delay_us`` for a
    request that came while its model was busy, after a batch of several requests that
    held more rows (module docstring)."""
    if (
        config.busy_delay_us
        and last[0] > 1
        and head.behind
        and rows < min(last[1], config.max_batch_size)
    ):
        delay_us = max(config.max_queue_delay_us, config.busy_delay_us)
        return delay_us, [config.max_batch_size, last[1]]
    return config.max_queue_delay_us, [config.max_batch_size]


def busy_target(rows: int, held: int) -> int:
    """With ``busy_delay_us``: how many rows the batch after one of ``rows`` waits for.

    Twice as many, so that a congested model's batches grow towards what its clients
    have in flight, at most ``held``: the most rows the model held at once (queued, and
    in batches out) when its last batches went, so that no batch waits for clients
    who are not there; and no more than :data:`GROW_UNTIL`, past which a batch waits
    only for as many rows as the last one had. Waiting only for as many kept whatever
    size congestion first gave a batch; doubling without the cap held batches for the
    whole delay, waiting for rows that no client would send; doubling without the
    limit cost clients whose batches were already large part of their throughput.
    """
    return max(rows, min(2 * rows, held, GROW_UNTIL))


@dataclass
class _Item:
    feed: dict[str, Array]
    meta: Queued
    future: asyncio.Future[dict[str, Array]]


class BatchSlots:
    """How many batches may be out at once (running, or waiting for a thread of the
    executor), shared by the batchers of one executor. A batcher that finds none free
    waits in line; a slot given back goes to the first in line. Used on one event loop.
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("at least one slot")
        self.size = size
        self.taken = 0
        self._waiting: deque[DynamicBatcher] = deque()

    def take(self, batcher: DynamicBatcher) -> bool:
        """A slot for ``batcher``, or ``False`` and ``batcher`` in line for the next one."""
        if self.taken < self.size:
            self.taken += 1
            return True
        if batcher not in self._waiting:
            self._waiting.append(batcher)
        return False

    def give_back(self) -> None:
        self.taken -= 1
        # to those in line until one takes it (one may have nothing due any more)
        while self._waiting and self.taken < self.size:
            self._waiting.popleft().pump()


class DynamicBatcher:
    """The queue and runner of one model. Lives on one event loop.

    Driven by callbacks, not by a task of its own: a request queued asks for one look
    at the queue at the end of the loop's turn (so that the requests of one turn go
    together), the batch goes to ``executor`` straight from there, and the thread
    that ran it hands the outputs back with one ``call_soon_threadsafe``, which
    answers the batch's requests and looks at the queue again: a task that waits for
    work and a task per batch cost each request the loop's scheduling several times
    over (measured: docs/benchmarks/index.md).

    ``on_batch(rows, queue_seconds_list, compute_seconds)`` is called after each
    batch, for metrics. Up to ``max_inflight`` batches are out at once; batchers that
    share an executor share ``slots`` instead.
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
        slots: BatchSlots | None = None,
    ) -> None:
        self.config = config
        self.name = name
        self._runner = runner
        self._executor = executor
        self._on_batch = on_batch
        self._clock = clock
        self._loop = asyncio.get_running_loop()
        self._queue: list[_Item] = []
        self._slots = slots or BatchSlots(max_inflight)
        self._out = 0  # batches of this model out now
        self._out_rows: dict[Hashable, int] = {}  # and their rows, by shapes (key_of)
        # busy_delay_us: the last batch's requests and rows, and how many rows of its
        # shapes the model held (queued and out) when each recent batch went
        self._last = (0, 0)
        self._held: deque[tuple[Hashable, int]] = deque(maxlen=HELD_WINDOW)
        self._closed = False
        self._looking = False  # a look at the queue is scheduled for this turn
        self._timer: asyncio.TimerHandle | None = None
        self._wait: tuple[int, float] | None = None  # the timer's: rows that end it sooner
        self._idle: asyncio.Future[None] | None = None  # close() waits for it

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
        future: asyncio.Future[dict[str, Array]] = self._loop.create_future()
        meta = Queued(rows, self.key_of(feed), self._clock(), deadline, self._out > 0)
        self._queue.append(_Item(feed, meta, future))
        if not self._looking and not self._still_waiting(rows, deadline):
            self._looking = True
            self._loop.call_soon(self.pump)
        if deadline is None:
            return await future
        try:
            return await asyncio.wait_for(future, max(deadline - self._clock(), 0.0))
        except asyncio.TimeoutError:
            raise DeadlineExceeded(
                f"the request's deadline passed while it waited for model {self.name}"
            ) from None

    def _still_waiting(self, rows: int, deadline: float | None) -> bool:
        """Whether the queue waits on as it did, with ``rows`` more: planning again
        could not send a batch before its timer (too few rows, no earlier deadline).
        Planning goes over the whole queue, so a long wait planned again at every
        request cost a busy model's loop more the longer its batches grew."""
        if self._wait is None or self._queue[0].future.done():  # not the head it planned
            return False
        more, wake = self._wait
        more -= rows
        self._wait = (more, wake)
        return more > 0 and (deadline is None or deadline >= wake)

    def pump(self) -> None:
        """Look at the queue: fail what has expired, send out what may go now (while
        there are slots), and set a timer for when to look again."""
        self._looking = False
        self._wait = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            while self._queue and self._send_one():
                pass
        except Exception:  # a bug here must not leave requests waiting forever
            log.exception("the batcher of %s stopped", self.name)
            self._closed = True
            for item in self._queue:
                self._resolve(item, Unavailable(f"model {self.name} cannot run requests now"))
            self._queue.clear()
        self._check_idle()

    def _send_one(self) -> bool:
        """Plan once; send a batch if one is due and a slot is free. Whether to plan
        again at once."""
        self._queue = [item for item in self._queue if not item.future.done()]
        if not self._queue:
            return False
        plan = self._plan()
        for index in plan.expired:
            self._resolve(
                self._queue[index],
                DeadlineExceeded(
                    f"the request's deadline passed while it was queued for model {self.name}"
                ),
            )
        if not plan.take:
            if plan.expired:
                return True
            if plan.wake_at is not None:
                self._timer = self._loop.call_later(
                    max(plan.wake_at - self._clock(), 0.0), self.pump
                )
                self._wait = (plan.more_rows, plan.wake_at)
            return False
        if not self._slots.take(self):
            return False  # pump() again when a slot is given back
        self._send(plan.take)
        return True

    def _plan(self) -> Plan:
        """:func:`plan_batch` over the queue now (while closing, what is queued goes at
        once), with what the model's last batches say of its congestion."""
        config = (
            replace(self.config, max_queue_delay_us=0, busy_delay_us=0)
            if self._closed
            else self.config
        )
        head = self._queue[0].meta.key  # only rows of its shapes can fill its batch
        held = max((rows for key, rows in self._held if key == head), default=0)
        last = (self._last[0], busy_target(self._last[1], held))
        return plan_batch([item.meta for item in self._queue], self._clock(), config, last)

    def _send(self, take: list[int]) -> None:
        """Out of the queue and to the executor: the requests at ``take``, one batch."""
        batch = [self._queue[i] for i in take]
        key, rows = batch[0].meta.key, sum(item.meta.rows for item in batch)
        held = self._out_rows.get(key, 0) + sum(
            item.meta.rows
            for item in self._queue
            if item.meta.key == key and not item.future.done()  # those just expired
        )
        taken = set(take)
        self._queue = [item for i, item in enumerate(self._queue) if i not in taken]
        try:
            self._executor.submit(self._run, batch)
        except Exception as exc:  # the executor is shut down: this batch fails, not later ones
            for item in batch:
                self._resolve(item, exc)
            self._slots.give_back()
            return
        self._out += 1
        self._out_rows[key] = self._out_rows.get(key, 0) + rows
        self._held.append((key, held))
        self._last = (len(batch), rows)

    def _run(self, batch: list[_Item]) -> None:
        """In the executor's thread: run the batch (one by one if it fails as a whole,
        so that only the culprit fails), and hand the results back to the loop."""
        result: Any = Unavailable(f"model {self.name} stopped while it ran")
        try:
            names = list(batch[0].feed)
            if len(batch) == 1:
                feed = batch[0].feed
            else:
                feed = {n: np.concatenate([item.feed[n] for item in batch]) for n in names}
            started = self._clock()  # a batch may wait for a thread: queue time, not compute
            outputs = self._runner(feed)
            result = (outputs, started, self._clock())
        except Exception as exc:
            if len(batch) == 1:
                result = exc
            else:
                log.warning(
                    "a batch of %d for %s failed (%s); re-running one by one",
                    len(batch),
                    self.name,
                    exc,
                )
                result = [self._one(item) for item in batch]
        finally:  # SystemExit or the like too: the batch is answered and its slot given back
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                self._loop.call_soon_threadsafe(self._finish, batch, result)

    def _one(self, item: _Item) -> dict[str, Array] | Exception:
        try:
            return self._runner(item.feed)
        except Exception as exc:
            return exc

    def _finish(self, batch: list[_Item], result: Any) -> None:
        """On the loop: answer a batch's requests, give its slot back, look again."""
        self._out -= 1
        key = batch[0].meta.key
        left = self._out_rows.pop(key) - sum(item.meta.rows for item in batch)
        if left:
            self._out_rows[key] = left
        try:
            if isinstance(result, Exception):
                for item in batch:
                    self._resolve(item, result)
            elif isinstance(result, list):  # run one by one
                for item, single in zip(batch, result, strict=True):
                    self._resolve(item, single)
            else:
                self._answer(batch, *result)
        except Exception as exc:  # whatever went wrong, no request of the batch is left waiting
            log.exception("a batch of %s failed", self.name)
            for item in batch:
                self._resolve(item, exc)
        finally:
            self._slots.give_back()
            self.pump()

    def _answer(
        self, batch: list[_Item], outputs: dict[str, Array], started: float, ended: float
    ) -> None:
        offset = 0
        for item in batch:
            end = offset + item.meta.rows
            self._resolve(item, {n: v[offset:end] for n, v in outputs.items()})
            offset = end
        if self._on_batch is not None:
            waits = [started - item.meta.enqueued for item in batch]
            self._on_batch(offset, waits, ended - started)

    @staticmethod
    def _resolve(item: _Item, result: dict[str, Array] | BaseException) -> None:
        if item.future.done():
            return
        if isinstance(result, BaseException):
            item.future.set_exception(result)
        else:
            item.future.set_result(result)

    def _check_idle(self) -> None:
        if self._idle is not None and not self._idle.done() and not self._queue and not self._out:
            self._idle.set_result(None)

    async def close(self) -> None:
        """Stop taking requests, run those already queued, then stop."""
        self._closed = True
        if self._idle is None:
            self._idle = self._loop.create_future()
        self.pump()
        await asyncio.shield(self._idle)
