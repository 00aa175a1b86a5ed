"""The benchmarks' load generator: each client on a connection of its own, as devices are."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from cloud_gateway.bench import load

from .support.gateway import GatewayHandle

ESTABLISHED = "01"


def connections_to(port: int) -> int:
    """Established TCP connections whose local port is ``port`` (the server's ends)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == ESTABLISHED and int(fields[1].rpartition(":")[2], 16) == port:
                count += 1
    return count


@pytest.mark.parametrize("client", ["raw", "tritonclient"])
def test_each_grpc_client_has_its_own_connection(
    gateway: GatewayHandle, tmp_path: Path, client: str
) -> None:
    data = tmp_path / "input.npy"
    np.save(data, np.zeros((1, 64), np.float32))
    port = gateway.gateway.grpc_port
    seen: list[int] = []
    done = threading.Event()

    def watch() -> None:  # until the load ends, however long its start takes
        while not done.is_set() and max(seen, default=0) < 4:
            seen.append(connections_to(port))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = load(
            "grpc", gateway.grpc_url, "digits-light", gateway.device_token, data, 4, 2.0,
            client=client,
        )  # fmt: skip
    finally:
        done.set()
        watcher.join()
    assert result["errors"] == 0 and result["requests"] > 0
    # gRPC would otherwise put the four channels on one shared connection
    assert max(seen) == 4
