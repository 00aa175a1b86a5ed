"""The REST API fuzzed from its own OpenAPI document (schemathesis): never a 5xx.

Two runs: every operation of the shared gateway with a device's token, as generated;
and the operations that take numbers from clients (a device's telemetry and update
reports, the admin API with an admin's token) on a gateway with an OTA repository and
the dashboard, with some of each generated body's values and query parameters
replaced by numbers no check should let through: integers of 400 digits, past 2^63
and 2^64, floats at their ends, and digits that are not ASCII ("²", "٣").
"""

from __future__ import annotations

import collections
import itertools
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from cloud_gateway.ota.groups import GroupKeys
from tests.support.daemon import light_repository
from tests.support.gateway import GatewayHandle, start_gateway
from tests.support.ota_world import LIGHT_INT8, signed_repository

# numbers no check should take as they are: each is refused, or read as what it says
NASTY: tuple[Any, ...] = (
    10**400, -(10**400), 2**63, 2**64, -(2**63) - 1, 2**53 + 1, 1e308, -1e308, 5e-324,
    -1, 0, 1.5, True, None,
    "²", "٣", "١٢", "1" * 401, "9" * 20, "+1", " 1", "1_0", "1e400", "NaN", "",
)  # fmt: skip

# of those, the ones no documented number takes (a type or a range it is not)
REFUSED: tuple[Any, ...] = (10**400, -(10**400), 2**64, True, "²", "٣", "1" * 401)


def is_refused(value: Any) -> bool:
    return any(type(value) is type(r) and value == r for r in REFUSED)  # True is not 1


Mutate = Callable[[schemathesis.Case, st.DataObject, dict[str, Any]], None]


def places(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of ``value`` and of every value inside it (object members, list items)."""
    yield path
    if isinstance(value, dict):
        items: Iterable[tuple[Any, Any]] = value.items()
    else:
        items = enumerate(value) if isinstance(value, list) else ()
    for key, inner in items:
        yield from places(inner, (*path, key))


def number_paths(schema: dict[str, Any], path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Where a JSON schema puts a number (an object's members, a map's entry "x", a
    list's first item): so that every documented number gets its turn, whether or not
    the generated body holds it."""
    if schema.get("type") in ("integer", "number"):
        yield path
    for key, inner in (schema.get("properties") or {}).items():
        yield from number_paths(inner, (*path, key))
    for key, part in (("x", "additionalProperties"), (0, "items")):
        if isinstance(schema.get(part), dict):
            yield from number_paths(schema[part], (*path, key))


def put(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    """A copy of ``value`` with ``new`` at ``path``, made where it is missing."""
    if not path:
        return new
    key, rest = path[0], path[1:]
    if isinstance(key, int):
        items = list(value) if isinstance(value, list) and value else [None]
        items[0] = put(items[0], rest, new)
        return items
    members = dict(value) if isinstance(value, dict) else {}
    members[key] = put(members.get(key), rest, new)
    return members


def nasty_numbers(case: schemathesis.Case, data: st.DataObject, schema: dict[str, Any]) -> None:
    """Most times, one to three places of the body (a documented number, or any value)
    and each query parameter at random become one of :data:`NASTY` (query parameters
    as text); else the case is sent as generated."""
    if data.draw(st.integers(0, 9)) == 0:
        return
    documented = list(number_paths(schema))
    if isinstance(case.body, (dict, list)):
        for _ in range(data.draw(st.integers(1, 3))):
            if documented and data.draw(st.integers(0, 3)):
                path = data.draw(st.sampled_from(documented))
            else:
                path = data.draw(st.sampled_from(list(places(case.body))))
            case.body = put(case.body, path, data.draw(st.sampled_from(NASTY)))
    if isinstance(case.query, dict):
        for key in list(case.query):
            if data.draw(st.booleans()):
                case.query[key] = str(data.draw(st.sampled_from([n for n in NASTY if n != ""])))


def fuzz(
    handle: GatewayHandle,
    wanted: Callable[[str], list[str] | None],
    *,
    mutate: Mutate | None = None,
    examples: int = 25,
) -> dict[tuple[str, str], collections.Counter[int]]:
    """Each operation whose path ``wanted`` gives tokens for (taken in turn), in
    positive and negative generation: never a 5xx, and every error is the table's
    ``{"error": ...}``. The statuses seen, by operation."""
    document = handle.gateway.app.openapi()
    schema = schemathesis.openapi.from_dict(document)
    seen: dict[tuple[str, str], collections.Counter[int]] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        tokens = wanted(operation.path)
        if tokens is None:
            continue
        token = itertools.cycle(tokens)
        body = document["paths"][operation.path][operation.method.lower()].get("requestBody")
        body_schema = body["content"]["application/json"]["schema"] if body else {}
        statuses = seen.setdefault(
            (operation.method.upper(), operation.path), collections.Counter()
        )
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode), data=st.data())
            @settings(
                max_examples=examples,
                deadline=None,
                derandomize=True,  # the same cases on every run: CI does not flake
                suppress_health_check=list(HealthCheck),
                database=None,
            )
            def check(case: schemathesis.Case, data: st.DataObject) -> None:
                if mutate is not None:
                    mutate(case, data, body_schema)  # noqa: B023
                # called at once, in this iteration: token and statuses are this operation's
                bearer = f"Bearer {next(token)}"  # noqa: B023
                headers = {**(case.headers or {}), "authorization": bearer}
                response = case.call(base_url=f"http://{handle.http_url}", headers=headers)
                statuses[response.status_code] += 1  # noqa: B023
                assert response.status_code < 500, (case.method, case.path, case.body,
                                                    case.query, response.text)  # fmt: skip
                if response.status_code >= 400:
                    assert set(response.json()) == {"error"}, response.text

            try:
                check()
            except Unsatisfiable:
                continue  # nothing to get wrong (negative) on an operation without parameters
    return seen


@pytest.mark.slow
def test_no_server_errors_from_generated_requests(gateway: GatewayHandle) -> None:
    def device(path: str) -> list[str] | None:
        # unloading models would disturb the other tests sharing this gateway
        return None if path.startswith("/v2/repository") else [gateway.device_token]

    seen = fuzz(gateway, device)
    assert len(seen) >= 14


@dataclass
class Fleet:
    """A gateway of its own, with an OTA repository (digits-light v1 published for the
    devices' group) and the dashboard, and devices enough that the update reports'
    rate limit (per device) never answers before the checks do."""

    handle: GatewayHandle
    devices: list[str]

    def tokens(self, path: str) -> list[str] | None:
        """Whose tokens an operation is fuzzed with: a device's for telemetry and
        updates, an admin's for the admin API, none for the others."""
        if path == "/v2/telemetry" or path.startswith("/v2/ota/"):
            return self.devices
        return [self.handle.admin_token] if path.startswith("/api/") else None


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root: Path = tmp_path_factory.mktemp("fuzzed")
    _, repo = signed_repository(root)
    group = GroupKeys(root / "state").ensure("rpi5-int8")[1]
    repo.publish(name="digits-light", version=1, model_file=LIGHT_INT8,
                 groups={"rpi5-int8": group})  # fmt: skip
    handle = start_gateway(root, light_repository(root), ota_repository=root / "ota",
                           poll_interval_s=0.0)  # fmt: skip
    devices = [handle.gateway.registry.add(f"cam-{i:02}", "rpi5-int8") for i in range(2, 18)]
    yield Fleet(handle, devices)
    handle.thread.stop()


@pytest.mark.slow
def test_huge_and_unicode_numbers_never_fail_telemetry_reports_or_the_admin_api(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    """Nor what comes after an answer: the telemetry taken is written (a flush once a
    second, and one more here), and nothing is logged as an error."""
    handle = fleet.handle
    with caplog.at_level(logging.WARNING):
        seen = fuzz(handle, fleet.tokens, mutate=nasty_numbers, examples=40)
        handle.gateway.telemetry.flush()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text[:2000]
    assert set(seen) >= {
        ("POST", "/v2/telemetry"),
        ("POST", "/v2/ota/report"),
        ("POST", "/v2/ota/check"),
        ("POST", "/api/rollouts/actions"),
        ("GET", "/api/fleet"),
        ("GET", "/api/actions"),
    }
    # the generated bodies reached the checks: some were taken, some refused (a report
    # whose numbers pass names a model its group was never offered: 404)
    for operation, passed in (
        (("POST", "/v2/telemetry"), 200),
        (("POST", "/v2/ota/report"), 404),
        (("POST", "/v2/ota/check"), 200),
    ):
        assert seen[operation][passed] and seen[operation][400], (operation, seen[operation])
    assert seen[("POST", "/api/rollouts/actions")][400], seen


# a valid request of each operation, into which the sweep puts its numbers one at a time
BASES: dict[tuple[str, str], dict[str, Any]] = {
    ("POST", "/v2/telemetry"): {"status": {"profile": "p"}},
    ("POST", "/v2/ota/report"): {"name": "digits-light", "version": 1, "status": "installed"},
    ("POST", "/v2/ota/check"): {"failing": True, "failures": 3, "detail": "no route"},
    ("POST", "/api/rollouts/actions"): {"action": "start", "name": "digits-light", "version": 1,
                                        "group": "rpi5-int8", "percent": 10},
}  # fmt: skip


@pytest.mark.slow
def test_every_documented_number_refuses_huge_and_unicode_numbers(
    fleet: Fleet,
) -> None:
    """Every number the OpenAPI document gives for telemetry, update reports and the
    admin API (in a body or a query), each of :data:`NASTY` in turn: never a 5xx, and
    a 400 naming what is wrong for those no range takes."""
    handle = fleet.handle
    document = handle.gateway.app.openapi()
    swept = collections.Counter[str]()
    with httpx.Client(base_url=f"http://{handle.http_url}", timeout=30) as client:
        for path, methods in document["paths"].items():
            for method, operation in methods.items():
                tokens = fleet.tokens(path)
                if tokens is None:
                    continue
                token = itertools.cycle(tokens)
                url = path.replace("{device_id}", "cam-01")
                body = operation.get("requestBody")
                schema = body["content"]["application/json"]["schema"] if body else {}
                base = BASES.get((method.upper(), path), {})
                if base:  # valid as it is: what the sweep's numbers change is the answer
                    headers = {"authorization": f"Bearer {next(token)}"}
                    answer = client.request(method, url, json=base, headers=headers)
                    assert answer.status_code == 200, (method, path, answer.text)
                for where in number_paths(schema):
                    for value in NASTY:
                        headers = {"authorization": f"Bearer {next(token)}"}
                        answer = client.request(method, url, json=put(base, where, value),
                                                headers=headers)  # fmt: skip
                        what = (method, path, where, value if value != 10**400 else "10**400")
                        assert answer.status_code < 500, (what, answer.text)
                        if is_refused(value):
                            assert answer.status_code == 400, (what, answer.text)
                            assert "must be" in answer.json()["error"], (what, answer.text)
                    swept[path] += 1
                for parameter in operation.get("parameters", []):
                    if parameter["in"] != "query" or parameter["schema"].get("type") not in (
                        "integer", "number"):  # fmt: skip
                        continue
                    for value in NASTY:
                        query = {parameter["name"]: str(value)}
                        headers = {"authorization": f"Bearer {next(token)}"}
                        answer = client.request(method, url, params=query, headers=headers)
                        assert answer.status_code < 500, (method, path, query, answer.text)
                        if is_refused(value):
                            assert answer.status_code == 400, (method, path, query, answer.text)
                    swept[f"{path}?{parameter['name']}"] += 1
    assert swept["/v2/telemetry"] >= 18 and swept["/v2/ota/report"] >= 3, swept
    assert swept["/v2/ota/check"] >= 1, swept

    assert swept["/api/rollouts/actions"] >= 3 and swept["/api/fleet?page"], swept
