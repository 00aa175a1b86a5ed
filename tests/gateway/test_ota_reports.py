"""What a device's update reports may cost the gateway: only versions its group was
offered are kept, a device's reports are rate-limited, and what is kept per device is
bounded; a device whose update checks fail says so, and the operator sees it."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from cloud_gateway.auth import DeviceRegistry
from cloud_gateway.dashboard.web import templates
from cloud_gateway.ota.rollouts import KEPT_VERSIONS, RolloutStore, in_slice
from cloud_gateway.ota.service import REPORT_BURST
from cloud_gateway.state import open_state
from tests.support.ota_world import GROUP, LIGHT_INT8, OtaWorld


def client(world: OtaWorld, device_id: str, group: str = GROUP) -> httpx.Client:
    token = world.enroll(device_id, group).enrollment.token
    return httpx.Client(
        base_url=world.url, headers={"authorization": f"Bearer {token}"}, timeout=10
    )


def report(name: str, version: int, status: str = "installed", **extra: Any) -> dict[str, Any]:
    return {"name": name, "version": version, "status": status, **extra}


def refused(world: OtaWorld, reason: str) -> float:
    value = world.gateway.gateway.metrics.registry.get_sample_value(
        "gateway_ota_reports_refused_total", {"reason": reason}
    )
    return value or 0.0


def kept(world: OtaWorld, table: str) -> list[tuple[Any, ...]]:
    with world.gateway.gateway.database.begin() as connection:
        return [tuple(row) for row in connection.execute(sa.text(f"SELECT * FROM {table}"))]


@pytest.mark.slow
def test_a_report_on_a_version_its_group_was_never_offered_is_refused_and_not_kept(
    world: OtaWorld,
) -> None:
    world.release("digits-light", 2, LIGHT_INT8)  # published for the group, rolled out
    world.publish("digits-light", 3, LIGHT_INT8, ["elsewhere"])  # another group's
    world.rollouts.start("digits-next", 5, GROUP, 100)  # offered by the plan, not published
    device = client(world, "cam-01")
    for name, version in (("made-up-1", 1), ("digits-light", 3), ("digits-light", 4)):
        answer = device.post("/v2/ota/report", json=report(name, version, serving=version))
        assert answer.status_code == 404, answer.text
        assert f"{name} v{version} is not published for group '{GROUP}'" in answer.text
        assert "versions its group was offered" in answer.text
    assert refused(world, "not_offered") == 3
    for name, version in (("digits-light", 2), ("digits-next", 5)):
        answer = device.post("/v2/ota/report", json=report(name, version, "failed"))
        assert answer.status_code == 200, answer.text
    assert sorted((row[1], row[2]) for row in kept(world, "reports")) == [
        ("digits-light", 2), ("digits-next", 5)
    ]  # fmt: skip
    assert kept(world, "serving") == []  # the refused ones said they served 1, 3 and 4
    models = {m["name"] for m in world.gateway.gateway.views.model_list()}
    assert "made-up-1" not in models
    # a report on a version published later is taken (the index follows the repository)
    world.publish("made-up-1", 1, LIGHT_INT8)
    assert device.post("/v2/ota/report", json=report("made-up-1", 1)).status_code == 200
    device.close()


@pytest.mark.slow
def test_a_flood_of_invented_reports_keeps_nothing(world: OtaWorld) -> None:
    world.release("digits-light", 2, LIGHT_INT8)
    device = client(world, "cam-01")
    statuses: dict[int, int] = {}
    for n in range(200):
        body = report(f"made-up-{n}", 1 + n, serving=1, detail="x" * 400)
        code = device.post("/v2/ota/report", json=body).status_code
        statuses[code] = statuses.get(code, 0) + 1
    assert set(statuses) <= {404, 429}, statuses
    assert kept(world, "reports") == [] and kept(world, "serving") == []
    assert refused(world, "not_offered") + refused(world, "rate_limited") == 200
    names = [m["name"] for m in world.gateway.gateway.views.model_list()]
    assert "digits-light" in names and not [n for n in names if n.startswith("made-up")]
    device.close()


@pytest.mark.slow
def test_a_devices_reports_are_rate_limited_and_not_its_neighbours(world: OtaWorld) -> None:
    world.release("digits-light", 2, LIGHT_INT8)
    first, second = client(world, "cam-01"), client(world, "cam-02")
    started = time.monotonic()
    codes = [
        first.post("/v2/ota/report", json=report("digits-light", 2)).status_code
        for _ in range(REPORT_BURST + 20)
    ]
    elapsed = time.monotonic() - started
    accepted = codes.count(200)
    assert REPORT_BURST <= accepted <= REPORT_BURST + elapsed + 1, (accepted, elapsed)
    assert codes.count(429) == len(codes) - accepted
    limited = first.post("/v2/ota/report", json=report("digits-light", 2))
    assert limited.status_code == 429
    assert "rate limit of 1 update reports/s exceeded for device 'cam-01'" in limited.text
    assert "bursts of up to 30" in limited.text
    # the check statuses share the allowance
    assert first.post("/v2/ota/check", json={"failing": False}).status_code == 429
    assert refused(world, "rate_limited") == len(codes) - accepted + 2
    assert second.post("/v2/ota/report", json=report("digits-light", 2)).status_code == 200
    first.close()
    second.close()


def test_each_device_keeps_reports_on_its_newest_versions_only(
    state_url: str,
) -> None:
    store = RolloutStore(open_state(state_url))
    for version in range(1, 26):
        store.report("d1", "g", "m", version, "installed")
    for version in (1, 2, 3):
        store.report("d1", "g", "n", version, "failed")
        store.report("d2", "g", "m", version, "installed")
    assert store.prune_reports() == 25 - KEPT_VERSIONS
    assert store.prune_reports() == 0
    with store.database.begin() as connection:
        rows = connection.execute(sa.text("SELECT device, name, version FROM reports")).all()
    kept_versions: dict[tuple[str, str], list[int]] = {}
    for device, name, version in rows:
        kept_versions.setdefault((device, name), []).append(version)
    assert {key: sorted(v) for key, v in kept_versions.items()} == {
        ("d1", "m"): list(range(26 - KEPT_VERSIONS, 26)),
        ("d1", "n"): [1, 2, 3],
        ("d2", "m"): [1, 2, 3],
    }
    store.database.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{}", "'failing' must be true or false"),
        (b'{"failing": "yes"}', "'failing' must be true or false"),
        (b'{"failing": true}', "'failures' must be an integer from 1 to 1000000000"),
        (b'{"failing": true, "failures": 0}', "from 1 to"),
        (b'{"failing": true, "failures": true}', "from 1 to"),
        (b'{"failing": true, "failures": 10000000000}', "from 1 to"),
        (b'{"failing": true, "failures": 1, "detail": 5}', "'detail' must be a string"),
        (b'{"failing": true, "failures": 1, "detail": "\\ud800"}', "lone surrogate"),
        (b"[]", "a check status is a JSON object"),
    ],
)
def test_a_malformed_check_status_is_a_400(world: OtaWorld, body: bytes, message: str) -> None:
    device = client(world, "cam-01")
    answer = device.post(
        "/v2/ota/check", content=body, headers={"content-type": "application/json"}
    )
    assert answer.status_code == 400, answer.text
    assert message in answer.text
    assert kept(world, "update_checks") == []
    device.close()


@pytest.mark.slow
def test_failing_update_checks_are_shown_with_the_rollouts_of_the_devices_slice(
    world: OtaWorld,
) -> None:
    world.release("digits-light", 2, LIGHT_INT8)
    device = client(world, "cam-01")
    assert in_slice("cam-01", "digits-light", 100)
    before = world.cli("rollout", "status", "--devices")
    assert "no device has reported yet" in before
    why = "PermissionError: [Errno 13] Permission denied: '/var/lib/edge-agent/ota/tuf/root.json'"
    body = {"failing": True, "failures": 3, "detail": why}
    assert device.post("/v2/ota/check", json=body).status_code == 200
    shown = world.cli("rollout", "status", "--devices")
    assert "update checks failing on 1" in shown
    assert f"device cam-01: update checks failing: {why} (3 in a row, for " in shown
    assert "no device has reported yet" not in shown
    assert f"device cam-01: update checks failing: {why}" in world.cli("rollout", "status")
    (card,) = world.gateway.gateway.views.rollout_list()
    assert [(c["device"], c["failures"], c["detail"]) for c in card["failing_checks"]] == [
        ("cam-01", 3, why)
    ]
    page = world.gateway.gateway.views.device("cam-01")
    assert page["update_checks"]["detail"] == why
    # a device of another group, or outside the slice, is not this rollout's
    other = client(world, "cam-09", "elsewhere")
    assert other.post("/v2/ota/check", json=body).status_code == 200
    (card,) = world.gateway.gateway.views.rollout_list()
    assert [c["device"] for c in card["failing_checks"]] == ["cam-01"]
    # one that succeeds again is not shown any more
    assert device.post("/v2/ota/check", json={"failing": False}).status_code == 200
    assert "update checks failing" not in world.cli("rollout", "status", "--devices")
    assert world.gateway.gateway.views.device("cam-01")["update_checks"] is None
    device.close()
    other.close()


@pytest.mark.slow
def test_a_failing_check_is_seen_through_the_dashboard_api(world: OtaWorld) -> None:
    world.release("digits-light", 2, LIGHT_INT8)
    admin = DeviceRegistry.add_to(
        world.gateway.gateway.config.state_url, "ops", "operators", role="admin"
    )  # before the device, whose first request makes the gateway read both
    device = client(world, "cam-01")
    body = {"failing": True, "failures": 1, "detail": "<b>the metadata</b>"}
    assert device.post("/v2/ota/check", json=body).status_code == 200
    headers = {"authorization": f"Bearer {admin}"}
    answer = httpx.get(f"{world.url}/api/rollouts", headers=headers)
    assert answer.status_code == 200, answer.text
    rollouts = answer.json()
    assert rollouts["rollouts"][0]["failing_checks"][0]["detail"] == "<b>the metadata</b>"
    # and on the rollout's card, escaped
    views = world.gateway.gateway.views
    card = (
        templates()
        .get_template("_rollouts.html")
        .render(rollouts=views.rollout_list(), actions=[], refresh=2)
    )
    assert "cam-01</a>: update checks failing: &lt;b&gt;the metadata&lt;/b&gt;" in card
    device.close()
