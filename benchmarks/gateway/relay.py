"""A bare gRPC relay: the floor under what any gRPC hop in Python adds (P10).

``python -m benchmarks remote`` runs it beside the gateway, in front of the same
engine and on the same cores, so that each round shows what a gRPC hop costs by
itself and what the gateway's own work (authentication, checks, metrics,
deadlines) adds on top. It forwards every unary call as it came: the request's
bytes and metadata, the answer's bytes, the engine's status; it parses nothing and
checks nothing, on the same ``grpc.aio`` server and client, and the same event loop
(:mod:`edge_core.loops`), as the gateway::

    python -m benchmarks.gateway.relay --listen 127.0.0.1:PORT --to 127.0.0.1:ENGINE
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from edge_core.loops import run

__all__ = ["main", "serve"]


async def serve(listen: str, to: str) -> None:
    """Relay every unary call made to ``listen`` to ``to`` until cancelled."""
    import grpc

    channel = grpc.aio.insecure_channel(to)
    calls: dict[str, Any] = {}

    def forwarder(method: str) -> Any:
        call = calls.get(method)
        if call is None:  # bytes in, bytes out: no (de)serializer
            call = calls[method] = channel.unary_unary(method)

        async def relay(request: bytes, context: Any) -> bytes:
            try:
                answer: bytes = await call(
                    request,
                    timeout=context.time_remaining(),
                    metadata=tuple(context.invocation_metadata() or ()),
                )
                return answer
            except grpc.aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "")
                raise  # abort raises; never reached

        return grpc.unary_unary_rpc_method_handler(relay)

    class Everything(grpc.GenericRpcHandler):  # type: ignore[misc]
        def service(self, details: Any) -> Any:
            return forwarder(details.method)

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((Everything(),))
    server.add_insecure_port(listen)
    await server.start()
    try:
        await server.wait_for_termination()
    finally:
        await server.stop(0)
        await channel.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT to serve")
    parser.add_argument("--to", required=True, help="the engine's HOST:PORT")
    args = parser.parse_args(argv)
    run(serve(args.listen, args.to))  # until the benchmark stops it; the gateway's loop
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
