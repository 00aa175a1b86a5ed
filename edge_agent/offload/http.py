"""Offload over HTTP: ``POST /v2/models/{name}/infer`` with binary tensors.

One ``httpx.Client`` per transport keeps connections alive between requests;
the device token goes in ``Authorization: Bearer``, a request id in
``X-Request-Id``. httpx's exceptions are translated here.

The deadline travels with the request, as the protocol's ``timeout`` parameter
(microseconds), so that the gateway gives up when the device does instead of
computing an answer nobody waits for. The gateway is told a little less than
the time left (:data:`ANSWER_MARGIN`), for its answer to come back in time.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any
from urllib.parse import quote

from edge_agent.offload.base import Transport
from edge_core.errors import (
    ModelNotFoundError,
    OffloadRejected,
    OffloadTimeout,
    OffloadUnavailable,
    ProtocolError,
)
from edge_core.protocol.rest import (
    HEADER_LENGTH,
    decode_infer_response,
    encode_infer_request,
)
from edge_core.protocol.types import InferRequest, InferResponse
from edge_core.tls import TLSSettings, client_context

__all__ = ["ANSWER_MARGIN", "HttpTransport", "gateway_timeout_us"]

# The share of the time left kept for the gateway's answer to travel back (at most 20 ms).
ANSWER_MARGIN = 0.1
MAX_ANSWER_MARGIN_S = 0.02


def gateway_timeout_us(request: InferRequest, timeout: float) -> int:
    """The ``timeout`` parameter to send: the time left less the way back, in
    microseconds, or the request's own when that is shorter."""
    budget = timeout - min(timeout * ANSWER_MARGIN, MAX_ANSWER_MARGIN_S)
    own = request.timeout_us  # 0 or none: no deadline of its own
    us = max(int(budget * 1e6), 1)
    return min(us, own) if own else us


class HttpTransport(Transport):
    name = "http"

    def __init__(
        self, base_url: str, *, token: str | None = None, tls: TLSSettings | None = None
    ) -> None:
        import httpx

        self._httpx = httpx
        if "://" not in base_url:
            base_url = ("https://" if tls else "http://") + base_url
        verify: Any = True
        if tls is not None:
            verify = client_context(tls)
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(base_url=base_url, headers=headers, verify=verify)
        self.base_url = base_url

    def infer(
        self, request: InferRequest, *, timeout: float, request_id: str = ""
    ) -> InferResponse:
        timeout_us = gateway_timeout_us(request, timeout)
        request = replace(request, parameters={**request.parameters, "timeout": timeout_us})
        body, header_length = encode_infer_request(request)
        headers = {"content-type": "application/octet-stream"}
        if header_length is not None:
            headers[HEADER_LENGTH] = str(header_length)
        if request_id:
            headers["x-request-id"] = request_id
        path = f"/v2/models/{quote(request.model_name, safe='')}"
        if request.model_version:
            path += f"/versions/{quote(request.model_version, safe='')}"
        response = self._send("POST", path + "/infer", timeout, content=body, headers=headers)
        length = response.headers.get(HEADER_LENGTH)
        try:
            answer = decode_infer_response(response.content, int(length) if length else None)
        except (ProtocolError, ValueError) as exc:
            raise OffloadRejected(f"malformed response from {self.base_url}: {exc}") from exc
        return replace(answer, wire_bytes=(len(body), len(response.content)))

    def _send(self, method: str, path: str, timeout: float, **kwargs: Any) -> Any:
        """The gateway's answer, a 200; any other status as the agent's offload error."""
        httpx = self._httpx
        try:
            response = self._client.request(method, path, timeout=max(timeout, 0.001), **kwargs)
        except httpx.TimeoutException as exc:
            raise OffloadTimeout(f"no answer from {self.base_url} within {timeout:.3f} s") from exc
        except httpx.TransportError as exc:
            raise OffloadUnavailable(f"gateway {self.base_url} unavailable: {exc}") from exc
        if response.status_code in (502, 503):
            raise OffloadUnavailable(f"gateway {self.base_url} unavailable: {_error(response)}")
        if response.status_code == 504:
            raise OffloadTimeout(f"the gateway gave up: {_error(response)}")
        if response.status_code != 200:
            raise OffloadRejected(
                f"the gateway refused ({response.status_code}): {_error(response)}",
                status=str(response.status_code),
            )
        return response

    def model_metadata(self, name: str, *, timeout: float) -> dict[str, Any] | None:
        try:
            response = self._send("GET", f"/v2/models/{quote(name, safe='')}", timeout)
        except OffloadRejected as exc:
            if exc.status == "404":
                raise ModelNotFoundError(str(exc)) from exc
            raise
        return _document(response, self.base_url)

    def server_metadata(self, *, timeout: float) -> dict[str, Any] | None:
        return _document(self._send("GET", "/v2", timeout), self.base_url)

    def repository_index(self, *, timeout: float) -> list[dict[str, Any]] | None:
        response = self._send("POST", "/v2/repository/index", timeout, json={"ready": True})
        index: list[dict[str, Any]] = _json(response, self.base_url, list, "index")
        return index

    def close(self) -> None:
        self._client.close()


def _document(response: Any, base_url: str) -> dict[str, Any]:
    document: dict[str, Any] = _json(response, base_url, dict, "metadata")
    return document


def _json(response: Any, base_url: str, kind: type, what: str) -> Any:
    """The answer's JSON, of ``kind``.

    Raises:
        OffloadRejected: it is not JSON, or not of ``kind``.
    """
    try:
        value = json.loads(response.content)
    except ValueError as exc:
        raise OffloadRejected(f"malformed {what} from {base_url}: {exc}") from exc
    if not isinstance(value, kind):
        raise OffloadRejected(f"malformed {what} from {base_url}: not a {kind.__name__}")
    return value


def _error(response: Any) -> str:
    try:
        return str(json.loads(response.content)["error"])
    except (ValueError, KeyError, TypeError):
        return str(response.text[:200] or response.reason_phrase)
