"""The dashboard without a browser: the health rule and the telemetry checks (pure), the
fleet store on SQLite and PostgreSQL, and the pages' and API's security over HTTP
against a real gateway (sign-in, cookies, CSRF, roles, escaping, headers, bounds)."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy

from cloud_gateway.auth import DeviceRegistry
from cloud_gateway.config import DashboardSettings
from cloud_gateway.fleet.charts import HEIGHT, WIDTH, line_chart, per_minute
from cloud_gateway.fleet.health import MISSED_INTERVALS, Reading, health
from cloud_gateway.fleet.ingest import TelemetryIngest
from cloud_gateway.fleet.store import MAX_ACTIONS, FleetStore, Sample
from cloud_gateway.fleet.telemetry import MAX_ENTRIES, MAX_TEXT, columns, decode
from cloud_gateway.metrics import GatewayMetrics
from cloud_gateway.state import open_state, schema
from edge_core.errors import BadRequest, PermissionDenied
from tests.support.daemon import light_repository
from tests.support.gateway import GatewayHandle, start_gateway
from tests.support.ota_world import LIGHT_INT8, OtaWorld, make_world
from tests.support.tls import make_cert

NOW = 1_800_000_000.0
XSS = "<script>alert(1)</script>"
HUGE_INT = 10**400  # what json.loads makes of 401 digits

# -- the health rule (pure) ---------------------------------------------------------------


def test_the_first_rule_that_holds_decides_health() -> None:
    fresh = Reading(at=NOW - 5, interval_s=30)
    assert health(fresh, None, NOW).state == "healthy"
    assert health(None, None, NOW).rule == "offline: never heard from"
    # silent for more than three intervals: offline, whatever it said last
    silent = dataclasses.replace(fresh, at=NOW - MISSED_INTERVALS * 30 - 1, throttled=True)
    assert health(silent, None, NOW).state == "offline"
    assert health(dataclasses.replace(silent, at=NOW - 89), None, NOW).state == "hot"
    # an update check (HTTP, no telemetry) counts as heard
    assert health(silent, NOW - 1, NOW).state == "hot"
    # its last will: offline until something newer comes
    will = dataclasses.replace(fresh, online="offline", online_at=NOW - 1)
    assert health(will, None, NOW).state == "offline"
    assert "last will" in health(will, None, NOW).rule
    assert health(will, NOW, NOW).state == "healthy"
    # hot beats degraded; critical says so
    both = dataclasses.replace(fresh, critical=True, hottest=86.5, breaker="open")
    verdict = health(both, None, NOW)
    assert verdict.state == "hot" and "critical (hottest zone 86.5 °C)" in verdict.rule
    assert health(dataclasses.replace(both, critical=False), None, NOW).state == "degraded"
    assert "breaker is open" in health(dataclasses.replace(both, critical=False), None, NOW).rule
    # a degraded answer counts for five minutes
    recent = dataclasses.replace(fresh, degraded_at=NOW - 299)
    assert health(recent, None, NOW).state == "degraded"
    assert health(dataclasses.replace(recent, degraded_at=NOW - 301), None, NOW).state == "healthy"


# -- what devices send, checked (pure) ----------------------------------------------------


def test_telemetry_is_bounded_and_a_bad_document_is_refused_whole() -> None:
    models = {f"m{i}": {"version": 1, "variant": "x" * 500} for i in range(100)}
    values = columns("status", {"profile": "p" * 1000, "models": models,
                                "temperatures": {"a": 40.0, "b": 71.5}, "throttled": True})  # fmt: skip
    assert len(values["profile"]) == MAX_TEXT
    kept = json.loads(values["models"])
    assert len(kept) == MAX_ENTRIES and all(len(m["variant"]) == MAX_TEXT for m in kept.values())
    assert values["hottest"] == 71.5 and values["throttled"] is True
    for bad in (
        {"temperatures": {"a": math.nan}},
        {"temperatures": {"a": 1e6}},
        {"cpu_load": -1},
        {"cpu_load": True},
        {"throttled": "yes"},
        {"profile": 3},
        {"queue": {"waiting": 1.5e300}},
    ):
        with pytest.raises(BadRequest):
            columns("status", bad)
    # a 400-digit integer in any number: refused, naming the field, never an OverflowError
    for kind, bad, field in (
        ("status", {"cpu_load": HUGE_INT}, "cpu_load"),
        ("status", {"temperatures": {"cpu": HUGE_INT}}, "a temperature"),
        ("status", {"queue": {"waiting": HUGE_INT}}, "queue.waiting"),
        ("status", {"interval_s": -HUGE_INT}, "interval_s"),
        ("status", {"models": {"m": {"version": HUGE_INT}}}, "a model's version"),
        ("status", {"offload": {"guard_refusals": {"faces": HUGE_INT}}}, "a refusal count"),
        ("decisions", {"decisions": [{"action": "LOCAL", "count": HUGE_INT}]}, "count"),
        ("decisions", {"degraded": HUGE_INT}, "degraded"),
        ("latency", {"by_answerer": {"device": {"p50_ms": HUGE_INT}}}, "latency p50_ms"),
        ("latency", {"by_answerer": {"device": {"p99_ms": float("inf")}}}, "latency p99_ms"),
    ):
        with pytest.raises(BadRequest, match=f"telemetry: {field} must be .* from"):
            columns(kind, bad)
    with pytest.raises(BadRequest):
        columns("thermal", {})
    with pytest.raises(BadRequest):
        columns("decisions", {"decisions": [{"action": f"a{i}", "count": 1} for i in range(40)]})
    with pytest.raises(BadRequest, match="over"):
        decode(b" " * (64 * 1024 + 1))
    with pytest.raises(BadRequest):
        decode(b"[1, 2]")
    # text keeps its characters: escaping is the pages' business
    assert columns("status", {"profile": XSS})["profile"] == XSS


def test_charts_stay_in_their_box_and_counts_become_rates() -> None:
    chart = line_chart("t", "ms", 0, 600, {"a": [(0, 0.0), (300, 7.0), (600, 3.0), (900, 99.0)]})
    assert chart.top == 10
    points = [tuple(map(float, p.split(","))) for p in chart.series[0].points.split()]
    assert len(points) == 3  # the one past the window is left out
    assert all(0 <= x <= WIDTH and 0 <= y <= HEIGHT for x, y in points)
    assert chart.series[0].last == 3.0
    # counts since the agent started; a restart (a count that fell) starts again from 0
    assert per_minute([(0, 10), (60, 70), (120, 100), (180, 20)]) == [
        (60, 60.0), (120, 30.0), (180, 20.0),
    ]  # fmt: skip
    assert line_chart("t", "", 0, 1, {"a": []}).empty


# -- the store, on both databases ---------------------------------------------------------


def sample(device: str, kind: str, at: float, document: dict[str, Any]) -> Sample:
    return Sample(device, kind, at, int(at // 60), "mqtt", None, columns(kind, document))


def test_the_store_keeps_the_latest_status_and_a_bounded_history(state_url: str) -> None:
    database = open_state(state_url)
    clock = [NOW]
    store = FleetStore(database, history_s=3600, clock=lambda: clock[0])
    try:
        for minute in range(120):  # two hours, a status and decisions a minute
            at = NOW - (120 - minute) * 60
            store.write([
                sample("cam-1", "status", at, {"temperatures": {"cpu": 50 + minute / 10},
                                               "interval_s": 30}),
                sample("cam-1", "decisions", at, {"decisions": [{"action": "LOCAL",
                                                                 "count": minute}],
                                                  "degraded": minute // 60}),
            ])  # fmt: skip
        # the same minute again (a repeat, or another replica): one point, the last wins
        store.write([sample("cam-1", "status", NOW - 60, {"temperatures": {"cpu": 90.0}})])
        status = store.status("cam-1")
        assert status is not None and status["hottest"] == 90.0
        assert status["decisions"] == {"LOCAL": 119}
        assert status["degraded_at"] == NOW - 60 * 60  # when the count last rose
        history = store.history("cam-1", NOW - 7200)
        assert len(history) == 120
        assert history[-1]["hottest"] == 90.0
        assert store.prune() == 60  # past the kept hour
        assert len(store.history("cam-1", NOW - 7200)) == 60
        store.set_online({"cam-1": ("offline", NOW)})
        store.set_online({"cam-1": ("online", NOW - 5)})  # an older retained one: ignored
        assert (store.statuses()["cam-1"]["online"]) == "offline"
        store.record_action("ops", "pause", "digits-light v2 for g", "now paused")
        assert store.actions()[0]["actor"] == "ops"
        assert MAX_ACTIONS == 10_000
    finally:
        database.close()


def test_every_document_the_checks_take_fits_both_databases(state_url: str) -> None:
    """Text at and past its column's length, NUL, counts past 32 bits: what the checks
    take is written (PostgreSQL refused each of these, and with it the whole batch)."""
    database = open_state(state_url)
    store = FleetStore(database)
    try:
        status = {"profile": "p\x00" * 300, "power_mode": "m" * 1000, "interval_s": 60,
                  "offload": {"breaker": "b" * 100, "guard_refusals": {"a": 2**53, "b": 2**53},
                              "link": {"bytes_sent": 2**53, "rtt_ms": 1e7}},
                  "queue": {"waiting": 2**53, "dropped": 2**40}, "seq": 2**63 - 1}  # fmt: skip
        decisions = {"decisions": [{"action": "LOCAL", "count": 2**53}], "degraded": 2**53}
        samples = [sample("cam-1", "status", NOW, status),
                   sample("cam-1", "decisions", NOW, decisions)]  # fmt: skip
        assert store.write(samples) == 2
        kept = store.status("cam-1")
        assert kept is not None
        assert len(kept["power_mode"]) == 64 and "\x00" not in kept["profile"]
        assert kept["queue_waiting"] == kept["guard_refusals"] == kept["degraded"] == 2**31 - 1
        assert kept["decisions"] == {"LOCAL": 2**53}
        assert kept["link"]["bytes_sent"] == 2**53  # JSON text: no column's bound
    finally:
        database.close()


def test_a_row_the_database_refuses_costs_only_itself(
    state_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    database = open_state(state_url)
    store = FleetStore(database)
    try:
        good = [sample(f"cam-{i}", "status", NOW, {"profile": f"p{i}"}) for i in range(9)]
        # past every check (made here by hand): a seq no database column holds
        bad = dataclasses.replace(good[4], device="cam-bad", seq=2**64)
        with caplog.at_level(logging.WARNING, logger="cloud_gateway.fleet.store"):
            assert store.write([*good[:4], bad, *good[4:]]) == 9
        statuses = store.statuses()
        assert sorted(statuses) == sorted(f"cam-{i}" for i in range(9))
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and not warnings[0].exc_info  # one line, no traceback
        assert "refused 1 document(s) of cam-bad" in warnings[0].getMessage()
    finally:
        database.close()


def test_the_ingest_keeps_the_newest_of_each_kind_and_drops_strangers(tmp_path: Path) -> None:
    database = open_state(f"sqlite:///{tmp_path / 'state.sqlite'}")
    registry = DeviceRegistry(database)
    registry.add("cam-1", "g")
    registry.add("ops", "operators", role="admin")
    metrics = GatewayMetrics()
    ingest = TelemetryIngest(registry, FleetStore(database), metrics, clock=lambda: NOW)
    try:
        status = {"profile": "p1", "seq": 2, "time": NOW}
        ingest.offer_message("devices/cam-1/telemetry/status", json.dumps(status).encode())
        older = {**status, "profile": "p0", "seq": 1}  # queued through an outage, late
        ingest.offer_message("devices/cam-1/telemetry/status", json.dumps(older).encode())
        ingest.offer_message("devices/nobody/telemetry/status", b"{}")
        ingest.offer_message("devices/cam-1/telemetry/status", b"not json")
        ingest.offer_message("devices/cam-1/status", b'{"state": "online"}')
        assert ingest.flush() == 1
        assert FleetStore(database).status("cam-1")["profile"] == "p1"  # type: ignore[index]
        dropped = metrics.registry.get_sample_value
        assert dropped("gateway_telemetry_dropped_total", {"reason": "unknown_device"}) == 1
        assert dropped("gateway_telemetry_dropped_total", {"reason": "malformed"}) == 1
        with pytest.raises(PermissionDenied):
            ingest.offer_http("ops", {"status": {}})
        with pytest.raises(BadRequest):  # one bad document: none of them is kept
            ingest.offer_http("cam-1", {"status": {"profile": "p2"}, "latency": {"by_answerer": 1}})
        assert ingest.pending == 0
    finally:
        database.close()


def test_one_devices_bad_seq_never_costs_another_its_telemetry(tmp_path: Path) -> None:
    """A seq of 2^64 (no database holds it) made every flush fail, and every device's
    telemetry of that second was lost: it is refused where it enters, MQTT and HTTP."""
    database = open_state(f"sqlite:///{tmp_path / 'state.sqlite'}")
    registry = DeviceRegistry(database)
    for device in ("cam-bad", "cam-good"):
        registry.add(device, "g")
    metrics = GatewayMetrics()
    ingest = TelemetryIngest(registry, FleetStore(database), metrics, clock=lambda: NOW)
    try:
        for seq in (2**64, -1, 1.5, "7", True):
            bad = json.dumps({"profile": "bad", "seq": seq}).encode()
            ingest.offer_message("devices/cam-bad/telemetry/status", bad)
            with pytest.raises(BadRequest, match="seq must be an integer from 0 to"):
                ingest.offer_http("cam-bad", {"decisions": {}, "status": {"seq": seq}})
        assert ingest.pending == 0  # nothing of a refused HTTP body kept, not even its first
        good = json.dumps({"profile": "good", "seq": 2**63 - 1}).encode()
        ingest.offer_message("devices/cam-good/telemetry/status", good)
        assert ingest.flush() == 1
        store = FleetStore(database)
        assert store.status("cam-bad") is None
        assert store.status("cam-good")["profile"] == "good"  # type: ignore[index]
        dropped = metrics.registry.get_sample_value
        assert dropped("gateway_telemetry_dropped_total", {"reason": "malformed"}) == 5
    finally:
        database.close()


# -- the pages and the API over HTTP, against a real gateway ------------------------------


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayHandle]:
    handle = start_gateway(tmp_path, light_repository(tmp_path),
                           dashboard=DashboardSettings(max_sessions=3))  # fmt: skip
    yield handle
    handle.thread.stop()


def login_token(page: httpx.Response) -> str:
    found = re.search(r'name="login_csrf" value="([^"]+)"', page.text)
    assert found, page.text
    return found.group(1)


def signed_in(gateway: GatewayHandle, token: str | None = None) -> httpx.Client:
    client = httpx.Client(base_url=f"http://{gateway.http_url}")
    page = client.get("/ui/login")
    answer = client.post("/ui/login", data={"login_csrf": login_token(page),
                                            "token": token or gateway.admin_token})  # fmt: skip
    assert answer.status_code == 303, answer.text
    return client


def csrf_of(client: httpx.Client) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', client.get("/ui/fleet").text)
    assert found
    return found.group(1)


@pytest.mark.slow
def test_sign_in_takes_an_admin_token_only_and_its_cookie_is_locked_down(
    gateway: GatewayHandle,
) -> None:
    client = httpx.Client(base_url=f"http://{gateway.http_url}")
    page = client.get("/ui/fleet")
    assert page.status_code == 303 and page.headers["location"] == "/ui/login"
    page = client.get("/ui/login")
    assert page.headers["content-security-policy"].startswith(
        "default-src 'none'; script-src 'self'"
    )
    assert page.headers["x-frame-options"] == "DENY"
    # no form token of its own (a cross-site form): refused before the token is looked at
    forged = httpx.post(f"http://{gateway.http_url}/ui/login", data={"token": gateway.admin_token})
    assert forged.status_code == 400 and "edge_session" not in forged.headers.get("set-cookie", "")
    refused = client.post("/ui/login", data={"login_csrf": login_token(page),
                                             "token": gateway.device_token})  # fmt: skip
    assert refused.status_code == 403 and "a device&#39;s token cannot sign in" in refused.text
    wrong = client.post("/ui/login", data={"login_csrf": login_token(refused), "token": "ops.x"})
    assert wrong.status_code == 401
    done = client.post("/ui/login", data={"login_csrf": login_token(wrong),
                                          "token": gateway.admin_token})  # fmt: skip
    cookie = next(c for c in done.headers.get_list("set-cookie") if c.startswith("edge_session="))
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Secure" not in cookie
    assert client.get("/ui/fleet").status_code == 200
    # the database keeps the cookie's hash, never the cookie
    value = cookie.split(";")[0].split("=", 1)[1]
    sessions = gateway.gateway.sessions
    with sessions.database.begin() as connection:
        rows = connection.execute(sqlalchemy.select(schema.sessions)).all()
    assert len(rows) == 1 and value not in json.dumps([list(row) for row in rows])
    # sign-ins are bounded: past max_sessions the least recently used end
    for _ in range(4):
        signed_in(gateway)
    assert sessions.count() == 3


@pytest.mark.slow
def test_the_cookie_is_secure_when_the_gateway_serves_tls(tmp_path: Path) -> None:
    from cloud_gateway.config import ServerTLSSettings

    ca = make_cert(tmp_path, "ca", None)
    make_cert(tmp_path, "server", ca, server=True)
    tls = ServerTLSSettings(cert=tmp_path / "server.pem", key=tmp_path / "server.key")
    handle = start_gateway(tmp_path, light_repository(tmp_path), tls=tls, poll_interval_s=0.0)
    try:
        client = httpx.Client(
            base_url=f"https://localhost:{handle.gateway.http_port}",
            verify=ssl.create_default_context(cafile=str(tmp_path / "ca.pem")),
        )
        page = client.get("/ui/login")
        answer = client.post("/ui/login", data={"login_csrf": login_token(page),
                                                "token": handle.admin_token})  # fmt: skip
        cookie = next(
            c for c in answer.headers.get_list("set-cookie") if c.startswith("edge_session=")
        )
        assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
        assert client.get("/ui/fleet").status_code == 200
    finally:
        handle.thread.stop()


@pytest.mark.slow
def test_every_action_needs_its_csrf_token_and_is_recorded_with_who_did_it(
    tmp_path: Path,
) -> None:
    world: OtaWorld = make_world(tmp_path / "world")
    try:
        device = world.enroll("cam-01")
        world.publish("digits-light", 2, LIGHT_INT8)
        # a device without a broker: its telemetry comes with its update check, over HTTP
        updater = world.updater(device)
        updater.telemetry = lambda: {"status": {"profile": "raspberry-pi-5", "interval_s": 60}}
        updater.check()
        store = world.gateway.gateway.fleet
        end = time.monotonic() + 10
        while (store.status("cam-01") or {}).get("source") != "http":
            assert time.monotonic() < end, "the update check's telemetry never arrived"
            time.sleep(0.1)
        assert store.status("cam-01")["interval_s"] == 60  # type: ignore[index]
        admin = DeviceRegistry.add_to(world.gateway.gateway.config.state_url, "ops", "operators",
                                      role="admin")  # fmt: skip
        handle = GatewayHandle(world.gateway, "", admin, world.state)
        client = signed_in(handle)
        start = {"action": "start", "name": "digits-light", "version": "2", "group": "rpi5-int8",
                 "percent": "10"}  # fmt: skip
        confirm = client.get("/ui/confirm", params=start)
        assert "Start the rollout of digits-light v2 for rpi5-int8 at 10%" in confirm.text
        assert client.post("/ui/act", data=start).status_code == 403  # no CSRF token
        assert client.post("/ui/act", data={**start, "csrf": "x" * 43}).status_code == 403
        assert world.rollouts.get("digits-light", 2, "rpi5-int8") is None
        done = client.post("/ui/act", data={**start, "csrf": csrf_of(client)})
        assert done.status_code == 303
        rollout = world.rollouts.get("digits-light", 2, "rpi5-int8")
        assert rollout is not None and rollout.percent == 10
        # the API: a session's action needs X-CSRF-Token; an admin's bearer token does not
        pause = {"action": "pause", "name": "digits-light", "version": 2, "group": "rpi5-int8"}
        assert client.post("/api/rollouts/actions", json=pause).status_code == 403
        bearer = {"authorization": f"Bearer {admin}"}
        answer = httpx.post(f"{world.url}/api/rollouts/actions", json=pause, headers=bearer)
        assert answer.status_code == 200 and answer.json()["by"] == "ops"
        other_device = {"authorization": f"Bearer {device.enrollment.token}"}
        assert httpx.post(f"{world.url}/api/rollouts/actions", json=pause,
                          headers=other_device).status_code == 403  # fmt: skip
        actions = httpx.get(f"{world.url}/api/actions", headers=bearer).json()["actions"]
        assert [(a["actor"], a["action"]) for a in actions] == [("ops", "pause"), ("ops", "start")]
        # not published for that group: refused, nothing started
        other = {**start, "group": "jetson", "csrf": csrf_of(client)}
        assert client.post("/ui/act", data=other).status_code == 400
    finally:
        world.stop()


def test_the_api_is_admin_only_bounded_and_in_the_openapi_document(
    gateway: GatewayHandle,
) -> None:
    url = f"http://{gateway.http_url}"
    admin = gateway.headers(gateway.admin_token)
    assert httpx.get(f"{url}/api/fleet").status_code == 401
    assert httpx.get(f"{url}/api/fleet", headers=gateway.headers()).status_code == 403
    fleet = httpx.get(f"{url}/api/fleet", headers=admin).json()
    assert fleet["counts"]["total"] == 1 and fleet["devices"][0]["id"] == "cam-01"
    assert httpx.get(f"{url}/api/fleet?size=201", headers=admin).status_code == 400
    assert httpx.get(f"{url}/api/fleet?health=purple", headers=admin).status_code == 400
    assert httpx.get(f"{url}/api/devices/nobody", headers=admin).status_code == 404
    paths = httpx.get(f"{url}/openapi.json").json()["paths"]
    for path in ("/api/fleet", "/api/devices/{device_id}", "/api/rollouts", "/api/models",
                 "/api/actions", "/api/rollouts/actions", "/v2/telemetry"):  # fmt: skip
        assert path in paths
    assert not [p for p in paths if p.startswith("/ui")]


def test_the_api_checks_who_asks_before_it_reads_the_query(gateway: GatewayHandle) -> None:
    """A stranger's or a device's malformed query is refused for who sent it (401, 403),
    never described to them (400): the admin check is the router's, ahead of the query."""
    url = f"http://{gateway.http_url}"
    for query in ("/api/fleet?size=201", "/api/fleet?page=0", "/api/actions?limit=x"):
        assert httpx.get(f"{url}{query}").status_code == 401, query
        assert httpx.get(f"{url}{query}", headers=gateway.headers()).status_code == 403, query


@pytest.mark.slow
def test_huge_and_unicode_numbers_are_400_on_the_telemetry_and_action_endpoints(
    gateway: GatewayHandle,
) -> None:
    """Each of these answered 500: a 400-digit integer in telemetry or in an action's
    percent or threshold, a version of "²"; "٣" (which int() reads as 3) was taken."""
    url = f"http://{gateway.http_url}"
    for document, field in (
        ({"status": {"cpu_load": HUGE_INT}}, "cpu_load"),
        ({"status": {"temperatures": {"cpu": HUGE_INT}}}, "a temperature"),
        ({"decisions": {"decisions": [{"action": "LOCAL", "count": HUGE_INT}]}}, "count"),
        ({"latency": {"by_answerer": {"cloud": {"p95_ms": HUGE_INT}}}}, "latency p95_ms"),
        ({"status": {"profile": "p", "seq": 2**64}}, "seq"),
    ):
        sent = httpx.post(f"{url}/v2/telemetry", json=document, headers=gateway.headers())
        assert sent.status_code == 400, (document, sent.text)
        assert f"telemetry: {field} must be" in sent.json()["error"]
    admin = gateway.headers(gateway.admin_token)
    start = {"action": "start", "name": "digits-light", "version": 2, "group": "rpi5-int8",
             "percent": 10}  # fmt: skip
    for change, field in (
        ({"percent": HUGE_INT}, "percent must be a number from 0 to 100"),
        ({"percent": "٣"}, "percent must be a number from 0 to 100, in at most 19 ASCII"),
        ({"failure_threshold": -HUGE_INT}, "failure_threshold must be a number from 0 to 100"),
        ({"version": "²"}, "version must be an integer from 1 to"),
        ({"version": "٣"}, "version must be an integer from 1 to"),
        ({"version": HUGE_INT}, "version must be an integer from 1 to"),
        ({"version": 2.0}, "version must be an integer from 1 to"),
    ):
        answer = httpx.post(f"{url}/api/rollouts/actions", json={**start, **change},
                            headers=admin)  # fmt: skip
        assert answer.status_code == 400 and field in answer.json()["error"], (change, answer.text)
    client = signed_in(gateway)
    for query in ({"version": "²"}, {"percent": "1" * 401}, {"failure_threshold": "٣"}):
        page = client.get("/ui/confirm", params={**start, **query})
        assert page.status_code == 400 and "ASCII digits" in page.text, (query, page.text)
    assert client.get("/ui/fleet", params={"page": "٣"}).status_code == 400


def test_a_device_that_never_sent_telemetry_has_its_page(gateway: GatewayHandle) -> None:
    """An enrolled device with no telemetry yet: its page, not a 500."""
    client = signed_in(gateway)
    for headers in ({}, {"hx-request": "true"}):  # the whole page, and its live part
        page = client.get("/ui/devices/cam-01", headers=headers)
        assert page.status_code == 200, page.text
        assert '<dd id="device-profile">–</dd>' in page.text and "none yet" in page.text
    admin = gateway.headers(gateway.admin_token)
    answer = httpx.get(f"http://{gateway.http_url}/api/devices/cam-01", headers=admin)
    assert answer.status_code == 200 and answer.json()["status"] is None


@pytest.mark.slow
def test_device_values_are_escaped_on_every_page(gateway: GatewayHandle) -> None:
    url = f"http://{gateway.http_url}"
    document = {"status": {"profile": XSS, "power_mode": XSS, "models": {XSS: {"version": 1,
                "variant": XSS}}, "temperatures": {XSS: 40.0}, "interval_s": 60}}  # fmt: skip
    sent = httpx.post(f"{url}/v2/telemetry", json=document, headers=gateway.headers())
    assert sent.status_code == 200 and sent.json() == {"kept": 1}
    assert httpx.post(f"{url}/v2/telemetry", json=document,
                      headers=gateway.headers(gateway.admin_token)).status_code == 403  # fmt: skip
    client = signed_in(gateway)
    end = time.monotonic() + 10
    while "&lt;script&gt;" not in client.get("/ui/fleet").text:
        assert time.monotonic() < end, "the telemetry never reached the page"
        time.sleep(0.2)
    for page in ("/ui/fleet", "/ui/devices/cam-01", "/ui/models", "/ui/rollouts"):
        text = client.get(page).text
        assert "<script>alert" not in text, page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in client.get("/ui/devices/cam-01").text
    # the live part alone, as htmx asks for it
    part = client.get("/ui/fleet", headers={"hx-request": "true"}).text
    assert part.startswith('<section id="fleet-live"') and "&lt;script&gt;" in part


def test_a_devices_page_shows_what_its_offload_link_carried(gateway: GatewayHandle) -> None:
    url = f"http://{gateway.http_url}"
    link = {"bytes_sent": 3 * 2**20, "bytes_received": 200 * 2**10, "rtt_ms": 41.5,
            "bandwidth_mbit_s": 9.4}  # fmt: skip
    document = {"status": {"interval_s": 60, "offload": {"breaker": "closed", "link": link}}}
    sent = httpx.post(f"{url}/v2/telemetry", json=document, headers=gateway.headers())
    assert sent.status_code == 200
    client = signed_in(gateway)
    expected = (
        '<dd id="device-link">3.0 MB sent, 200.0 KB received; round trip ~41.5 ms, ~9.4 Mbit/s'
    )
    end = time.monotonic() + 10
    while expected not in client.get("/ui/devices/cam-01").text:
        assert time.monotonic() < end, "the telemetry never reached the page"
        time.sleep(0.2)
    bad = {"status": {"offload": {"link": {"bandwidth_mbit_s": -1}}}}
    refused = httpx.post(f"{url}/v2/telemetry", json=bad, headers=gateway.headers())
    assert refused.status_code == 400 and "bandwidth_mbit_s" in refused.json()["error"]


def test_the_vendored_htmx_is_the_pinned_release() -> None:
    import hashlib

    from cloud_gateway.dashboard import web

    folder = Path(web.__file__).parent / "static"
    data = (folder / "htmx.min.js").read_bytes()
    assert hashlib.sha256(data).hexdigest() == web.HTMX_SHA256
    assert "Zero-Clause BSD" in (folder / "htmx.LICENSE").read_text()
