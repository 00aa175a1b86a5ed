"""A bare gRPC echo server, the floor an offload round trip is measured against.

``python -m benchmarks.agent.grpc_echo`` serves one unary method,
``/bench.Echo/Echo``, on a free loopback port, built as the gateway builds its
own gRPC server (``grpc.aio``, the same options, on the same event loop:
:mod:`edge_core.loops`) and returning the request's
bytes untouched: no protobuf parsing, no authentication, no model. It prints
its port on one line, then serves until SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from edge_core.loops import run

__all__ = ["METHOD", "main"]

METHOD = "/bench.Echo/Echo"


async def _serve() -> None:
    import grpc

    async def echo(request: bytes, context: object) -> bytes:
        return request

    # the gateway's options (cloud_gateway.server), so only the work inside differs
    options = [
        ("grpc.max_receive_message_length", 64 * 1024 * 1024),
        ("grpc.max_send_message_length", 64 * 1024 * 1024),
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.aio.server(options=options)
    handler = grpc.method_handlers_generic_handler(
        "bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    print(port, flush=True)
    await stop.wait()
    await server.stop(grace=1)


def main() -> int:
    run(_serve())  # on the loop the gateway runs on
    return 0


if __name__ == "__main__":
    sys.exit(main())
