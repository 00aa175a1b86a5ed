"""Dynamic batching: the pure planner, and the batcher with a fake runner (our own seam)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cloud_gateway import batching
from cloud_gateway.batching import BatchSlots, DynamicBatcher, Queued, busy_target, plan_batch
from cloud_gateway.config import BatchingSettings, load_config
from edge_core.errors import ConfigError, DeadlineExceeded, Unavailable

CONFIG = BatchingSettings(max_batch_size=8, max_queue_delay_us=1000)


def q(
    rows: int = 1,
    at: float = 0.0,
    key: str = "a",
    deadline: float | None = None,
    behind: bool = True,  # it came while a batch of the model was out
) -> Queued:
    return Queued(rows=rows, key=key, enqueued=at, deadline=deadline, behind=behind)


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


BUSY = BatchingSettings(max_batch_size=8, max_queue_delay_us=0, busy_delay_us=2000)


def test_busy_delay_waits_for_as_many_rows_as_the_last_batch() -> None:
    # the last batch held 4 requests (5 rows): 2 queued rows wait, up to 2 ms
    plan = plan_batch([q(at=0.0), q(at=0.0001)], 0.0005, BUSY, last=(4, 5))
    assert plan.take == [] and plan.wake_at == pytest.approx(0.002)
    assert plan_batch([q(at=0.0), q(at=0.0001)], 0.002, BUSY, last=(4, 5)).take == [0, 1]
    # as full as the last one: no wait
    queue = [q(at=0.0), q(rows=2, at=0.0), q(rows=2, at=0.0001)]
    assert plan_batch(queue, 0.0002, BUSY, last=(4, 5)).take == [0, 1, 2]


def test_busy_delay_never_holds_a_lone_client() -> None:
    assert plan_batch([q()], 0.0, BUSY).take == [0]  # nothing ran before
    assert plan_batch([q()], 0.0, BUSY, last=(1, 6)).take == [0]  # one request of 6 rows
    assert plan_batch([q()], 0.0, BUSY, last=(2, 2)).take == []  # two clients: it waits


def test_busy_delay_never_holds_a_request_that_found_the_model_idle() -> None:
    # the last batch held 4, but this request came when nothing of the model was out:
    # traffic at random, not clients waiting on each other's batch
    assert plan_batch([q(behind=False)], 0.0, BUSY, last=(4, 5)).take == [0]
    assert plan_batch([q(behind=False), q()], 0.0, BUSY, last=(4, 5)).take == [0, 1]


def test_busy_delay_stops_at_a_full_batch() -> None:
    # the last batch was larger than max_batch_size allows now: a full one goes
    queue = [q(rows=4), q(rows=4)]
    assert plan_batch(queue, 0.0, BUSY, last=(10, 30)).take == [0, 1]


def test_a_wait_says_how_many_rows_more_could_end_it() -> None:
    # busy: 2 of the 5 rows it waits for are there
    assert plan_batch([q(), q()], 0.0, BUSY, last=(4, 5)).more_rows == 3
    # a preferred size comes sooner; a full batch is the last resort
    config = replace(BUSY, preferred_batch_sizes=[4])
    assert plan_batch([q(), q()], 0.0, config, last=(4, 5)).more_rows == 2
    assert plan_batch([q(rows=3)], 0.0, CONFIG).more_rows == 5


def test_the_longer_of_the_two_delays_applies() -> None:
    config = BatchingSettings(max_batch_size=8, max_queue_delay_us=5000, busy_delay_us=2000)
    assert plan_batch([q()], 0.0, config, last=(3, 3)).wake_at == pytest.approx(0.005)
    assert plan_batch([q()], 0.0, config).wake_at == pytest.approx(0.005)


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


@pytest.mark.slow
def test_busy_delay_gathers_concurrent_clients_and_spares_a_lone_one() -> None:
    model = FakeModel(delay=0.05)
    config = BatchingSettings(max_batch_size=16, max_queue_delay_us=0, busy_delay_us=300_000)

    def x(i: int) -> dict[str, np.ndarray]:
        return {"x": np.full((1, 2), i, np.float32)}

    async def main() -> tuple[float, float]:
        with ThreadPoolExecutor(1) as pool:
            batcher = DynamicBatcher(model, config, pool)

            def three() -> asyncio.Future[list[dict[str, np.ndarray]]]:
                return asyncio.gather(*(batcher.submit(x(i)) for i in range(3)))

            await three()  # at once: 3
            # one that finds the model idle goes at once, though the last batch had 3
            started = time.monotonic()
            await batcher.submit(x(0))
            idle = time.monotonic() - started
            await three()
            # three clients again while a batch of three runs, one late: the two wait
            running = three()
            await asyncio.sleep(0.01)
            behind = asyncio.gather(batcher.submit(x(0)), batcher.submit(x(1)))
            await asyncio.sleep(0.08)
            await asyncio.gather(running, behind, batcher.submit(x(2)))
            # one behind a batch of three, alone: it waits for the others, then goes
            running = three()
            await asyncio.sleep(0.01)
            started = time.monotonic()
            await batcher.submit(x(0))
            waited = time.monotonic() - started
            await running
            await batcher.close()
            return idle, waited

    idle, waited = run(main())
    assert model.batches == [3, 1, 3, 3, 3, 3, 1]
    assert idle < 0.2
    assert waited >= 0.25


def test_the_busy_target_doubles_up_to_what_the_model_held() -> None:
    assert busy_target(4, 64) == 8  # short of its clients: the next batch waits for more
    assert busy_target(4, 4) == 4  # no more rows were ever there: wait for none that are not
    assert busy_target(12, 64) == 16  # up to 16 rows, whose fixed costs are spread thin
    assert busy_target(40, 64) == 40  # a batch that large waits only for as many again


def one(i: int) -> dict[str, np.ndarray]:
    return {"x": np.full((1, 1), i, np.float32)}


async def closed_loop(
    batcher: DynamicBatcher, client: int, rounds: int, think: float = 0.0
) -> None:
    """One client: a request, its answer, ``think`` seconds, the next request."""
    for _ in range(rounds):
        assert (await batcher.submit(one(client)))["y"].tolist() == [[2 * client]]
        if think:
            await asyncio.sleep(think)


def test_busy_batches_grow_towards_the_clients_in_flight() -> None:
    """Eight clients split into two batches of four, one running while the other goes:
    with busy_delay_us they become one batch of eight (a batch that only waited for as
    many rows as the last one would alternate 4 and 4 for ever)."""
    model = FakeModel(delay=0.05)
    config = BatchingSettings(max_batch_size=16, max_queue_delay_us=0, busy_delay_us=2_000_000)

    async def main() -> None:
        with ThreadPoolExecutor(2) as pool:
            batcher = DynamicBatcher(model, config, pool, max_inflight=2)
            first = [asyncio.ensure_future(closed_loop(batcher, i, 8)) for i in range(4)]
            await asyncio.sleep(0.005)  # the first four are running
            second = [asyncio.ensure_future(closed_loop(batcher, i, 8)) for i in range(4, 8)]
            await asyncio.wait_for(asyncio.gather(*first, *second), timeout=30)
            await batcher.close()

    run(main())
    assert model.batches[:2] == [4, 4]
    assert model.batches[-4:] == [8, 8, 8, 8]


@pytest.mark.slow
def test_a_busy_batch_never_waits_for_more_clients_than_there_are() -> None:
    """Two clients in a batch, a third behind it: the third waits for the two to come
    back, not for twice two rows that three clients can never send (doubling without
    the cap held it for the whole busy delay)."""
    model = FakeModel(delay=0.3)
    config = BatchingSettings(max_batch_size=16, max_queue_delay_us=0, busy_delay_us=3_000_000)
    waits: list[float] = []

    async def main() -> float:
        with ThreadPoolExecutor(2) as pool:
            batcher = DynamicBatcher(
                model, config, pool, max_inflight=2, on_batch=lambda r, q, t: waits.extend(q)
            )
            started = time.monotonic()
            first = [asyncio.ensure_future(closed_loop(batcher, i, 3)) for i in range(2)]
            await asyncio.sleep(0.005)  # the two are running
            await asyncio.wait_for(asyncio.gather(*first, closed_loop(batcher, 2, 3)), 30)
            took = time.monotonic() - started
            await batcher.close()
            return took

    took = run(main())
    assert model.batches[:2] == [2, 3]  # the third went with the two that came back
    assert max(waits) < 2.0 and took < 2.5


@pytest.mark.slow
def test_a_waiting_queue_is_planned_again_only_when_it_could_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Requests that cannot end a wait are queued without planning the whole queue
    again; one with a deadline before the wait's end is planned for (and fails at it),
    and the one that completes the rows the wait is for sends the batch at once."""
    plans: list[int] = []

    def counted(queue, *args):  # type: ignore[no-untyped-def]
        plans.append(len(queue))
        return plan_batch(queue, *args)

    monkeypatch.setattr(batching, "plan_batch", counted)
    model = FakeModel(delay=0.8)
    config = BatchingSettings(max_batch_size=16, max_queue_delay_us=0, busy_delay_us=5_000_000)

    async def main() -> tuple[float, object]:
        with ThreadPoolExecutor(2) as pool:
            batcher = DynamicBatcher(model, config, pool, max_inflight=2)
            running = asyncio.gather(*(batcher.submit(one(i)) for i in range(4)))
            await asyncio.sleep(0.05)  # four run; what comes now waits for four rows
            plans.clear()
            started = time.monotonic()
            waiting = [asyncio.ensure_future(batcher.submit(one(0)))]
            await asyncio.sleep(0.01)
            waiting.append(asyncio.ensure_future(batcher.submit(one(1))))
            await asyncio.sleep(0.01)
            seen = list(plans)  # the first was planned for, the second not
            late = batcher.submit(one(9), deadline=time.monotonic() + 0.02)
            failed = (await asyncio.gather(late, return_exceptions=True))[0]
            seen.append(len(plans) - 1)  # planned for (else only wait_for would fail it)
            await asyncio.gather(*waiting, batcher.submit(one(2)), batcher.submit(one(3)))
            took = time.monotonic() - started
            await running
            await batcher.close()
            assert seen[0] == 1 and seen[1] > 0
            return took, failed

    took, failed = run(main())
    assert isinstance(failed, DeadlineExceeded)
    assert took < 2.0  # the batch went with its fourth row, not after the busy delay
    assert model.batches[:2] == [4, 4]


def test_requests_of_other_shapes_do_not_count_towards_a_busy_batch() -> None:
    """Four clients of one shape and four of another: each shape's batch waits for
    rows of its own shape, not for the eight the model held in all."""
    model = FakeModel(delay=0.01)
    config = BatchingSettings(max_batch_size=16, max_queue_delay_us=0, busy_delay_us=2_000_000)

    async def client(batcher: DynamicBatcher, width: int) -> None:
        for _ in range(10):
            await batcher.submit({"x": np.ones((1, width), np.float32)})

    async def main() -> float:
        with ThreadPoolExecutor(2) as pool:
            batcher = DynamicBatcher(model, config, pool, max_inflight=2)
            started = time.monotonic()
            narrow = [asyncio.ensure_future(client(batcher, 1)) for _ in range(4)]
            await asyncio.sleep(0.002)
            wide = [asyncio.ensure_future(client(batcher, 2)) for _ in range(4)]
            await asyncio.wait_for(asyncio.gather(*narrow, *wide), timeout=60)
            took = time.monotonic() - started
            await batcher.close()
            return took

    assert run(main()) < 1.5  # not one busy delay of 2 s after another
    assert set(model.batches) == {4}


def test_a_wait_whose_request_went_away_holds_no_later_one() -> None:
    """The request a wait was planned for is cancelled (its client went away): one
    that then finds the model idle goes at once, not when that wait would have ended."""
    model = FakeModel(delay=0.01)
    config = BatchingSettings(max_batch_size=16, max_queue_delay_us=0, busy_delay_us=3_000_000)

    async def main() -> float:
        with ThreadPoolExecutor(2) as pool:
            batcher = DynamicBatcher(model, config, pool, max_inflight=2)
            first = asyncio.gather(*(batcher.submit(one(i)) for i in range(4)))
            await asyncio.sleep(0.002)
            head = asyncio.ensure_future(batcher.submit(one(4)))  # behind: waits for 4 rows
            await first
            await asyncio.sleep(0.02)
            head.cancel()
            await asyncio.sleep(0.001)
            started = time.monotonic()
            await asyncio.wait_for(batcher.submit(one(5)), timeout=10)
            took = time.monotonic() - started
            await batcher.close()
            return took

    assert run(main()) < 1.0


def test_idle_models_leave_the_shared_slots_to_busy_ones() -> None:
    """More models than shared slots: the idle ones must not hold them all."""
    models = [FakeModel() for _ in range(4)]

    async def main() -> np.ndarray:
        slots = BatchSlots(2)
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


@pytest.mark.slow
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


def test_close_runs_what_is_queued_without_a_busy_delay() -> None:
    model = FakeModel()
    config = BatchingSettings(max_batch_size=8, max_queue_delay_us=0, busy_delay_us=5_000_000)

    async def main() -> float:
        with ThreadPoolExecutor(1) as pool:
            batcher = DynamicBatcher(model, config, pool)
            ones = {"x": np.ones((1, 1), np.float32)}
            await asyncio.gather(*(batcher.submit(ones) for _ in range(3)))  # busy: 3 at once
            pending = asyncio.ensure_future(batcher.submit(ones))  # would wait up to 5 s
            await asyncio.sleep(0.01)
            started = time.monotonic()
            await batcher.close()
            await pending
            return time.monotonic() - started

    assert run(main()) < 2.0  # closing runs it at once, not after the busy delay
    assert model.batches == [3, 1]


def test_busy_delay_is_read_from_the_config_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text('repository = "models"\n[batching]\nbusy_delay_us = 1500\n')
    assert load_config(path).batching.busy_delay_us == 1500
    path.write_text('repository = "models"\n[models.m.batching]\nbusy_delay_us = -1\n')
    with pytest.raises(ConfigError, match="busy_delay_us"):
        load_config(path)


def test_the_requests_of_one_turn_go_together() -> None:
    """With no delay, what is queued in one turn of the loop is one batch, not the
    first request alone and the rest after it."""
    model = FakeModel()
    config = BatchingSettings(max_batch_size=16, max_queue_delay_us=0)

    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            batcher = DynamicBatcher(model, config, pool, max_inflight=2)
            await asyncio.gather(
                *(batcher.submit({"x": np.full((1, 1), i, np.float32)}) for i in range(5))
            )
            await batcher.close()

    run(main())
    assert model.batches == [5]


def test_a_shared_slot_goes_to_the_next_in_line() -> None:
    """One slot, two models: the second model's batch waits for the slot and runs when
    the first model's batch gives it back; one in line with nothing due any more does
    not keep it from the next."""
    slow, other, third = FakeModel(delay=0.1), FakeModel(), FakeModel()
    config = BatchingSettings(max_batch_size=4, max_queue_delay_us=0)

    async def main() -> None:
        slots = BatchSlots(1)
        with ThreadPoolExecutor(2) as pool:
            a, b, c = (DynamicBatcher(m, config, pool, slots=slots) for m in (slow, other, third))
            first = asyncio.ensure_future(a.submit({"x": np.ones((1, 1), np.float32)}))
            await asyncio.sleep(0.02)  # a's batch holds the one slot
            gone = asyncio.ensure_future(b.submit({"x": np.ones((1, 1), np.float32)}))
            waiting = asyncio.ensure_future(c.submit({"x": np.ones((1, 1), np.float32)}))
            await asyncio.sleep(0.02)
            assert slots.taken == 1 and not waiting.done()
            gone.cancel()  # b is first in line, but has nothing due when the slot is back
            result = await asyncio.wait_for(waiting, timeout=5)
            assert result["y"].tolist() == [[2.0]]
            await first
            for batcher in (a, b, c):
                await batcher.close()
            assert slots.taken == 0

    run(main())
    assert slow.batches == [1] and other.batches == [] and third.batches == [1]


def test_a_shut_down_executor_fails_every_batch_and_frees_its_slot() -> None:
    model = FakeModel()
    config = BatchingSettings(max_batch_size=1, max_queue_delay_us=0)

    async def main() -> tuple[list[object], int]:
        pool = ThreadPoolExecutor(1)
        pool.shutdown()
        slots = BatchSlots(1)
        batcher = DynamicBatcher(model, config, pool, slots=slots)
        # many batches at once: each fails in turn (no recursion, none left waiting)
        failed = await asyncio.wait_for(
            asyncio.gather(
                *(batcher.submit({"x": np.ones((1, 1), np.float32)}) for _ in range(400)),
                return_exceptions=True,
            ),
            timeout=10,
        )
        await batcher.close()
        return failed, slots.taken

    failed, taken = run(main())
    assert len(failed) == 400 and all(isinstance(f, RuntimeError) for f in failed)
    assert taken == 0 and model.batches == []


def test_a_runner_that_raises_systemexit_fails_its_batch_and_frees_its_slot() -> None:
    def leaving(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise SystemExit(3)

    async def main() -> tuple[object, int]:
        slots = BatchSlots(1)
        with ThreadPoolExecutor(1) as pool:
            batcher = DynamicBatcher(leaving, CONFIG, pool, slots=slots)
            outcome = await asyncio.wait_for(
                asyncio.gather(
                    batcher.submit({"x": np.ones((1, 1), np.float32)}), return_exceptions=True
                ),
                timeout=5,
            )
            await asyncio.wait_for(batcher.close(), timeout=5)
        return outcome[0], slots.taken

    failed, taken = run(main())
    assert isinstance(failed, Unavailable) and taken == 0


def test_a_planning_bug_fails_the_queue_instead_of_leaving_it_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: object) -> None:
        raise TypeError("a bug")

    monkeypatch.setattr("cloud_gateway.batching.plan_batch", broken)

    async def main() -> object:
        with ThreadPoolExecutor(1) as pool:
            batcher = DynamicBatcher(FakeModel(), CONFIG, pool)
            outcome = await asyncio.gather(
                asyncio.wait_for(batcher.submit({"x": np.ones((1, 1), np.float32)}), 5),
                return_exceptions=True,
            )
            with pytest.raises(Unavailable):  # and it takes no more
                await batcher.submit({"x": np.ones((1, 1), np.float32)})
            return outcome[0]

    assert isinstance(run(main()), Unavailable)


def test_close_waits_for_the_batch_that_runs() -> None:
    model = FakeModel(delay=0.2)

    async def main() -> bool:
        with ThreadPoolExecutor(1) as pool:
            batcher = DynamicBatcher(model, CONFIG, pool)
            pending = asyncio.ensure_future(batcher.submit({"x": np.ones((1, 1), np.float32)}))
            await asyncio.sleep(0.05)  # running now
            await batcher.close()
            return pending.done() and not pending.cancelled()

    assert run(main())
