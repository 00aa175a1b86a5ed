"""What an offload costs: the link's round trip and bandwidth learnt from the agent's
own exchanges, and per model its bytes and the gateway's time (fake clock)."""

from __future__ import annotations

import pytest

from edge_agent.offload.costs import FIRST_PICTURE_SHARE, OffloadCosts
from edge_agent.offload.link import STALE_S, LinkEstimator


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def exchange(mbit_s: float, rtt_ms: float, nbytes: int, server_ms: float) -> tuple[float, float]:
    """(whole time, the gateway's share) of an exchange over such a link, in seconds."""
    total = rtt_ms / 1000 + nbytes * 8 / (mbit_s * 1e6) + server_ms / 1000
    return total, server_ms / 1000


def test_round_trip_from_small_exchanges_and_bandwidth_from_large_ones() -> None:
    link = LinkEstimator(clock=Clock())
    assert link.estimate(1000) is None  # nothing learnt yet
    link.observe(300, *exchange(10, 40, 300, 0.0))  # a metadata lookup
    for _ in range(3):
        link.observe(120_000, *exchange(10, 40, 120_000, 30.0))  # pictures
    estimate = link.estimate(250_000)
    assert estimate is not None
    assert estimate.rtt_ms == pytest.approx(40.24, abs=0.5)  # 300 bytes of it at 10 Mbit/s
    assert estimate.bandwidth_mbit_s == pytest.approx(10, rel=0.02)
    assert estimate.transfer_ms == pytest.approx(200, rel=0.02)
    assert estimate.network_ms == pytest.approx(240, rel=0.02)
    assert link.samples == 4


def test_the_estimate_follows_a_change_of_bandwidth_within_five_exchanges() -> None:
    link = LinkEstimator(clock=Clock())
    link.observe(300, *exchange(100, 20, 300, 0.0))
    for _ in range(5):
        link.observe(150_000, *exchange(100, 20, 150_000, 20.0))
    before = link.estimate(150_000)
    assert before is not None and before.bandwidth_mbit_s == pytest.approx(100, rel=0.05)
    for count in range(1, 6):  # 100 -> 2 Mbit/s
        link.observe(150_000, *exchange(2, 20, 150_000, 20.0))
        estimate = link.estimate(150_000)
        assert estimate is not None and estimate.bandwidth_mbit_s is not None
        if count == 1:  # the time per byte averaged: a slower link is felt at once
            assert estimate.bandwidth_mbit_s < 4.0
    assert estimate.bandwidth_mbit_s == pytest.approx(2, rel=0.1)


def test_a_sample_without_the_gateways_time_is_left_out_and_old_ones_expire() -> None:
    clock = Clock()
    link = LinkEstimator(clock=clock)
    link.observe(150_000, 0.5, None)  # a relayed answer: no server time
    assert link.estimate(1) is None and link.samples == 0
    link.observe(300, 0.02, 0.0)
    assert link.estimate(1) is not None
    clock.now += STALE_S + 1  # the link may have changed since: the next request learns it
    assert link.estimate(1) is None


def test_the_cost_of_an_offload_is_round_trip_bytes_over_bandwidth_and_gateway_time() -> None:
    costs = OffloadCosts(clock=Clock())
    raw = 3_686_400  # a 640x480 FP32 picture tensor
    assert costs.estimate("ppocr-det", raw, picture=True) is None  # nothing learnt
    assert costs.expected_bytes("ppocr-det", raw, picture=True) == (
        int(raw * FIRST_PICTURE_SHARE),
        0,
    )
    assert costs.expected_bytes("ppocr-det", raw, picture=False) == (raw, 0)
    costs.link.observe(500, 0.04, 0.0)  # a metadata lookup: the round trip
    for _ in range(4):  # a JPEG of 90 kB up, a packed map of 8 kB down, 60 ms in the gateway
        total, server = exchange(10, 40, 98_000, 60.0)
        costs.observe(
            "ppocr-det", raw_bytes=raw, sent=90_000, received=8_000, total_s=total, server_s=server
        )
    assert costs.expected_bytes("ppocr-det", raw, picture=True) == pytest.approx(
        (90_000, 8_000), abs=2
    )
    estimate = costs.estimate("ppocr-det", raw, picture=True)
    assert estimate is not None
    assert estimate.server_ms == pytest.approx(60.0, rel=0.05)
    assert estimate.transfer_ms == pytest.approx(98_000 * 8 / 10e6 * 1000, rel=0.05)
    assert estimate.total_ms == pytest.approx(40 + 78.4 + 60, rel=0.05)
    parts = estimate.to_dict()
    assert parts["bytes_up"] == 90_000 and parts["bytes_down"] == 8_000
    assert costs.traffic()["ppocr-det"] == {"sent": 360_000, "received": 32_000, "answered": 4}
    assert (costs.sent, costs.received) == (360_000, 32_000)
    assert costs.knows("ppocr-det") and not costs.knows("other")


def test_models_kept_are_bounded_and_totals_are_not_forgotten() -> None:
    from edge_agent.offload.costs import MODELS

    costs = OffloadCosts(clock=Clock())
    for index in range(MODELS + 10):
        costs.observe(f"m{index}", raw_bytes=10, sent=10, received=1, total_s=0.01, server_s=0.0)
    assert len(costs.traffic()) == MODELS and not costs.knows("m0")
    assert costs.sent == 10 * (MODELS + 10)


def test_without_small_exchanges_the_parts_are_fitted_or_not_guessed() -> None:
    """MQTT asks the gateway nothing: with no small exchange, a line through samples of
    different sizes tells the round trip from the transfer; samples of one size do not,
    and no bandwidth is claimed (an exchange of that size is still priced right)."""
    same = LinkEstimator(clock=Clock())
    for _ in range(4):
        same.observe(100_000, *exchange(10, 40, 100_000, 50.0))
    estimate = same.estimate(100_000)
    assert estimate is not None and estimate.bandwidth_mbit_s is None
    assert estimate.network_ms == pytest.approx(40 + 80, rel=0.01)  # all of it, as the trip
    varied = LinkEstimator(clock=Clock())
    for size in (60_000, 120_000, 240_000, 60_000, 120_000):
        varied.observe(size, *exchange(10, 40, size, 50.0))
    fitted = varied.estimate(240_000)
    assert fitted is not None and fitted.bandwidth_mbit_s == pytest.approx(10, rel=0.05)
    assert fitted.rtt_ms == pytest.approx(40, abs=2)


def test_a_stale_transfer_or_gateway_time_lets_the_next_request_go() -> None:
    """Small exchanges keep the round trip fresh; what a transfer takes, and the
    gateway's time for a model, go stale on their own: no estimate, so a model once
    judged too slow is tried again."""
    clock = Clock()
    costs = OffloadCosts(clock=clock)
    costs.link.observe(500, 0.04, 0.0)
    total, server = exchange(2, 40, 400_000, 60.0)
    costs.observe(
        "big", raw_bytes=400_000, sent=400_000, received=0, total_s=total, server_s=server
    )
    assert costs.estimate("big", 400_000, picture=False) is not None
    clock.now += STALE_S + 1
    costs.link.observe(500, 0.04, 0.0)  # small traffic goes on
    assert costs.link.estimate(500) is not None  # the round trip is fresh
    assert costs.link.estimate(400_000) is None  # the transfer is not
    assert costs.estimate("big", 400_000, picture=False) is None  # nor the gateway's time
