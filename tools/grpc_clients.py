"""Stock gRPC clients in one process, in a closed loop: the requests they see fail.

    python tools/grpc_clients.py --url 127.0.0.1:8001 --token TOKEN --clients 64,256

Each client is a ``tritonclient.grpc.InferenceServerClient`` of its own, one a thread,
sending batch-1 requests one after another for ``--seconds``. gRPC gives the channels of
one process with the same target and options one connection, so N clients are N calls
at once on a single HTTP/2 connection, against the server's per-connection stream
limit. It prints, for each client count, the requests answered and the failures by
status and message. ``tests/gateway/test_grpc_clients.py`` runs it against a real gateway.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as tgrpc
from tritonclient.utils import InferenceServerException

__all__ = ["Load", "closed_loop"]

FEATURES = 64  # the wide MLP's and the digits models' input: [1, 64] FP32 "pixels"


@dataclass
class Load:
    """What a closed loop saw: requests answered by each client, failures by status
    and message, and whether every client ended in time."""

    answered: list[int]
    failures: Counter[str] = field(default_factory=Counter)
    hung: int = 0

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    def summary(self) -> str:
        total = sum(self.answered) + self.failed
        lines = [f"{len(self.answered)} clients: {self.failed} of {total} requests failed"]
        lines += [f"  {count} x {what}" for what, count in self.failures.most_common()]
        if self.hung:
            lines.append(f"  {self.hung} clients still waiting at the end")
        return "\n".join(lines)


def closed_loop(
    url: str,
    token: str,
    clients: int,
    seconds: float,
    *,
    model: str = "wide-mlp",
    input_name: str = "pixels",
    patience: float = 60.0,
) -> Load:
    """``clients`` stock clients, a thread each, sending batch-1 requests to ``model``
    one after another for ``seconds``, all starting at once. A call may take up to
    ``patience`` seconds (then it is a failure), so the loop always ends."""
    load = Load([0] * clients)
    lock = threading.Lock()
    start = threading.Barrier(clients + 1, timeout=patience)
    deadline = [0.0]

    def client(index: int) -> None:
        connection = tgrpc.InferenceServerClient(url)
        tensor = tgrpc.InferInput(input_name, [1, FEATURES], "FP32")
        tensor.set_data_from_numpy(np.full((1, FEATURES), index % 16, np.float32))
        try:
            start.wait()
            while time.monotonic() < deadline[0]:
                try:
                    connection.infer(
                        model, [tensor], headers={"authorization": f"Bearer {token}"},
                        client_timeout=patience,
                    )  # fmt: skip
                    load.answered[index] += 1
                except InferenceServerException as exc:
                    with lock:
                        load.failures[f"{exc.status()}: {exc.message()}"] += 1
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    deadline[0] = time.monotonic() + seconds
    start.wait()
    for thread in threads:
        thread.join(timeout=max(0.0, deadline[0] - time.monotonic()) + 2 * patience)
    load.hung = sum(thread.is_alive() for thread in threads)
    return load


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="127.0.0.1:8001", help="the gateway's gRPC address")
    parser.add_argument("--token", required=True, help="a device token (`device add`)")
    parser.add_argument("--clients", default="64,256", help="client counts, e.g. 64,256")
    parser.add_argument("--seconds", type=float, default=6.0, help="seconds per count")
    parser.add_argument("--model", default="wide-mlp", help="a model taking [1, 64] FP32")
    args = parser.parse_args(argv)
    failed = 0
    for clients in (int(n) for n in args.clients.split(",")):
        load = closed_loop(args.url, args.token, clients, args.seconds, model=args.model)
        print(load.summary(), flush=True)
        failed += load.failed + load.hung
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
