"""The REST API fuzzed from its own OpenAPI document (schemathesis): never a 5xx."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

from .support.gateway import GatewayHandle


def test_no_server_errors_from_generated_requests(gateway: GatewayHandle) -> None:
    document = gateway.gateway.app.openapi()
    schema = schemathesis.openapi.from_dict(document)
    base_url = f"http://{gateway.http_url}"
    tested = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path.startswith("/v2/repository"):
            continue  # unloading models would disturb the other tests sharing this gateway
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            strategy = operation.as_strategy(generation_mode=mode)

            @given(case=strategy)
            @settings(
                max_examples=25,
                deadline=None,
                derandomize=True,  # the same cases on every run: CI does not flake
                suppress_health_check=list(HealthCheck),
                database=None,
            )
            def check(case: schemathesis.Case) -> None:
                headers = dict(case.headers or {})
                headers.setdefault("authorization", f"Bearer {gateway.device_token}")
                response = case.call(base_url=base_url, headers=headers)
                assert response.status_code < 500, (case.method, case.path, response.text)
                if response.status_code >= 400:
                    assert set(response.json()) == {"error"}, response.text

            try:
                check()
            except Unsatisfiable:
                assert mode == schemathesis.GenerationMode.NEGATIVE
                continue  # nothing to get wrong on an operation without parameters
            tested.append((operation.method, operation.path, mode))
    assert len(tested) >= 14
