"""Dynamic batching: the pure planner, and the batcher with a fake runner (our own seam)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from cloud_gateway.batching import DynamicBatcher, Queued, plan_batch
from cloud_gateway.config import BatchingSettings
from edge_core.errors import DeadlineExceeded

CONFIG = BatchingSettings(max_batch_size=8, max_queue_delay_us=1000)


def q(rows: int = 1, at: float = 0.0, key: str = "a", deadline: float | None = None) -> Queued:
    return Queued(rows=rows, key=key, enqueued=at, deadline=deadline)


def test_empty_queue_sleeps() -> None:
    plan = plan_batch([], 0.0, CONFIG)
    assert plan.take == [] and plan.wake_at is None


def test_waits_for_more_until_the_delay() -> None:
    plan = plan_batch([q(at=0.0), q(at=0.0002)], 0.0005, CONFIG)
    assert plan.take == [] and plan.wake_at == pytest.approx(0.001)
    assert plan_batch([q(at=0.0), q(at=0.0002)], 0.001, CONFIG).take == [0, 1]


def test_a_full_batch_goes_at_once() -> None:
    queue = [q(rows=3), q(rows=3), q(rows=3), q(rows=1)]
    assert plan_batch(queue, 0.0, CONFIG).take == [0, 1]  # 3 + 3; the next 3 would overflow


def test_rows_are_counted_not_requests() -> None:
    assert plan_batch([q(rows=8)], 0.0, CONFIG).take == [0]
    assert plan_batch([q(rows=20)], 0.0, CONFIG).take == [0]  # larger than max: alone


def test_only_requests_with_the_same_shapes_go_together() -> None:
    queue = [q(key="a"), q(key="b"), q(key="a")]
    assert plan_batch(queue, 1.0, CONFIG).take == [0, 2]


def test_preferred_size_goes_without_waiting() -> None:
    config = BatchingSettings(
        max_batch_size=8, max_queue_delay_us=10_000, preferred_batch_sizes=(2, 4)
    )
    assert plan_batch([q(), q(), q()], 0.0, config).take == [0, 1]
    assert plan_batch([q(), q(), q(), q(), q()], 0.0, config).take == [0, 1, 2, 3]
    assert plan_batch([q()], 0.0, config).take == []


def test_expired_requests_are_failed_not_run() -> None:
    plan = plan_batch([q(deadline=0.5), q(at=0.9995)], 1.0, CONFIG)
    assert plan.expired == [0]
    assert plan.take == []
    assert plan.wake_at == pytest.approx(1.0005)


def test_wakes_for_the_nearest_deadline() -> None:
    plan = plan_batch([q(at=0.0, deadline=0.0004)], 0.0001, CONFIG)
    assert plan.wake_at == pytest.approx(0.0004)


def test_zero_delay_runs_what_is_there() -> None:
    config = BatchingSettings(max_batch_size=8, max_queue_delay_us=0)
    assert plan_batch([q(), q()], 0.0, config).take == [0, 1]


class FakeModel:
    """Doubles its input; records each batch; can be slow or fail on a marker value."""

    def __init__(self, delay: float = 0.0) -> None:
        self.batches: list[int] = []
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = feed["x"]
        with self.lock:
            self.batches.append(x.shape[0])
        if self.delay:
            time.sleep(self.delay)
        if np.any(x < 0):
            raise ValueError("negative input")
        return {"y": x * 2}


def run(coroutine):  # type: ignore[no-untyped-def]
    return asyncio.run(coroutine)


def test_concurrent_requests_share_one_batch() -> None:
    model = FakeModel()

    async def main() -> list[np.ndarray]:
        with ThreadPoolExecutor(1) as pool:
            batcher = DynamicBatcher(
                model, BatchingSettings(max_batch_size=16, max_queue_delay_us=20_000), pool
            )
            results = await asyncio.gather(
                *(batcher.submit({"x": np.full((1, 2), i, np.float32)}) for i in range(6))
            )
            await batcher.close()
            return [r["y"] for r in results]

    results = run(main())
    assert model.batches == [6]
    for i, y in enumerate(results):
        assert y.tolist() == [[2 * i, 2 * i]]


def test_idle_models_leave_the_shared_slots_to_busy_ones() -> None:
    """More models than shared slots: the idle ones must not hold them all."""
    models = [FakeModel() for _ in range(4)]

    async def main() -> np.ndarray:
        slots = asyncio.Semaphore(2)
        with ThreadPoolExecutor(1) as pool:
            batchers = [DynamicBatcher(m, CONFIG, pool, slots=slots) for m in models]
            await asyncio.sleep(0.01)  # every batcher's loop is waiting for work
            result = await asyncio.wait_for(
                batchers[-1].submit({"x": np.ones((1, 2), np.float32)}), timeout=5
            )
            for batcher in batchers:
                await batcher.close()
            return result["y"]

    assert run(main()).tolist() == [[2.0, 2.0]]
    assert models[-1].batches == [1]


def test_a_bad_request_fails_alone() -> None:
    model = FakeModel()

    async def main() -> list[object]:
        with ThreadPoolExecutor(1) as pool:
            batcher = DynamicBatcher(
                model, BatchingSettings(max_batch_size=16, max_queue_delay_us=20_000), pool
            )
            values = [1.0, -1.0, 3.0]
            results = await asyncio.gather(
                *(batcher.submit({"x": np.full((1, 1), v, np.float32)}) for v in values),
                return_exceptions=True,
            )
            await batcher.close()
            return results

    good, failed, other = run(main())
    assert isinstance(failed, ValueError)
    assert good["y"].tolist() == [[2.0]] and other["y"].tolist() == [[6.0]]  # type: ignore[index]
    assert model.batches[0] == 3  # tried together first, then one by one


def test_each_request_keeps_its_deadline() -> None:
    model = FakeModel(delay=0.5)

    async def main() -> tuple[object, object, float]:
        with ThreadPoolExecutor(1) as pool:
            batcher = DynamicBatcher(
                model, BatchingSettings(max_batch_size=1, max_queue_delay_us=0), pool
            )
            loop = asyncio.get_running_loop()
            first = asyncio.ensure_future(batcher.submit({"x": np.ones((1, 1), np.float32)}))
            await asyncio.sleep(0.01)  # the first is running now; the second must wait
            started = loop.time()
            second = await asyncio.gather(
                batcher.submit(
                    {"x": np.ones((1, 1), np.float32)}, deadline=time.monotonic() + 0.05
                ),
                return_exceptions=True,
            )
            waited = loop.time() - started
            result = await first
            await batcher.close()
            return result, second[0], waited

    result, second, waited = run(main())
    assert isinstance(second, DeadlineExceeded)
    assert waited < 0.3  # answered at its 50 ms deadline, not when the model got to it (0.5 s)
    assert result["y"].tolist() == [[2.0]]  # type: ignore[index]
    assert model.batches == [1]  # the expired request never ran


def test_close_runs_what_is_queued() -> None:
    model = FakeModel()

    async def main() -> object:
        with ThreadPoolExecutor(1) as pool:
            batcher = DynamicBatcher(
                model, BatchingSettings(max_batch_size=4, max_queue_delay_us=5_000_000), pool
            )
            pending = asyncio.ensure_future(batcher.submit({"x": np.ones((1, 1), np.float32)}))
            await asyncio.sleep(0.01)
            await batcher.close()
            return await pending

    assert run(main())["y"].tolist() == [[2.0]]  # type: ignore[index]
