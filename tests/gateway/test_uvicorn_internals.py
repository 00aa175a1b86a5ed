"""What the REST front end's connection guard uses of uvicorn's own code
(``cloud_gateway/rest/connections.py``, ``direct.py``): its httptools protocol, which
they subclass, its status lines, and the private ``_unset_keepalive_if_required``.
uvicorn is pinned to the range tested (pyproject.toml); a release that moves any of
these fails here, not in production."""

from __future__ import annotations

import asyncio
import inspect

from uvicorn.config import Config
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

# the protocol's methods the guard calls or overrides, with their parameters
METHODS = {
    "__init__": None,
    "connection_made": ["transport"],
    "connection_lost": ["exc"],
    "data_received": ["data"],
    "on_message_begin": [],
    "on_url": ["url"],
    "on_header": ["name", "value"],
    "on_headers_complete": [],
    "on_body": ["body"],
    "on_message_complete": [],
    "on_response_complete": [],
    "send_400_response": ["msg"],
    "shutdown": [],
    "timeout_keep_alive_handler": [],
    "_unset_keepalive_if_required": [],
}
# what a connection holds that the guard reads
ATTRIBUTES = (
    "cycle", "pipeline", "flow", "server_state", "parser", "url", "headers", "tasks",
    "transport", "loop", "expect_100_continue", "timeout_keep_alive_task",
)  # fmt: skip


def test_the_protocols_methods_are_there_with_their_parameters() -> None:
    for name, parameters in METHODS.items():
        method = getattr(HttpToolsProtocol, name)
        if parameters is not None:
            found = list(inspect.signature(method).parameters)[1:]
            assert found == parameters, (name, found)


class Transport(asyncio.Transport):
    """Enough of a socket's transport for uvicorn to take a connection."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 5000)}.get(name, default)

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def answer(scope: dict[str, object], receive: object, send: object) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": []})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": b""})  # type: ignore[operator]


def test_a_connection_holds_what_the_guard_reads() -> None:
    loop = asyncio.new_event_loop()
    try:
        config = Config(app=answer, http="httptools")
        config.load()
        protocol = HttpToolsProtocol(config, ServerState(), {}, _loop=loop)
        protocol.connection_made(Transport())
        protocol.data_received(b"GET /v2 HTTP/1.1\r\nHost: gateway\r\n\r\n")
        missing = [name for name in ATTRIBUTES if not hasattr(protocol, name)]
        assert missing == [], missing
        assert hasattr(protocol.flow, "write_paused")
        assert protocol.cycle is not None and hasattr(protocol.cycle, "response_complete")
        assert protocol.url == b"/v2" and (b"host", b"gateway") in protocol.headers
        assert hasattr(protocol.server_state, "default_headers")
        loop.run_until_complete(asyncio.gather(*protocol.tasks))
        assert protocol.transport.written.startswith(b"HTTP/1.1 204")  # type: ignore[attr-defined]
    finally:
        loop.close()
    assert STATUS_LINE[431].startswith(b"HTTP/1.1 431")
    assert STATUS_LINE[503].startswith(b"HTTP/1.1 503")
    source = inspect.getsource(httptools_impl.HttpToolsProtocol.data_received)
    assert "except httptools.HttpParserError" in source  # parser errors: send_400_response
