"""What a flood of distinct unknown model names does to a running agent: its RSS and the
size of its ``/metrics``, before and after the flood (issue 11's defects 1 and 2).

    python tools/growth_figures.py [--tree DIR] [--names 20000] [--json FILE]

``--tree`` runs the agent of another checkout (e.g. a worktree of an older commit) with
this machine's Python, so that one run compares two versions side by side. The agent
offloads to a gateway (this checkout's, on loopback), which answers each name 404, as
the defects were seen; ``--no-gateway``: the device answers them itself.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def _get(port: int, path: str) -> bytes:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path)
        return connection.getresponse().read()
    finally:
        connection.close()


def measure(
    tree: Path, names: int, gateway: dict[str, Any] | None, name_bytes: int = 120
) -> dict[str, Any]:
    """Start ``tree``'s agent, flood it with ``names`` names of ``name_bytes`` (within
    the naming rule's 128), and say what grew."""
    body = json.dumps(
        {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}
    )
    with tempfile.TemporaryDirectory(prefix="growth-") as tmp:
        port = _free_port()
        config = Path(tmp) / "agent.toml"
        offload = ""
        if gateway is not None:
            token = Path(tmp) / "device.token"
            token.write_text(gateway["token"])
            token.chmod(0o600)
            offload = f'[gateway]\naddress = "{gateway["grpc"]}"\ntoken_file = "{token}"\n'
        config.write_text(
            f'device_id = "cam-01"\nprofile = "generic-x86_64"\n'
            f'model_dir = "{tree / "models"}"\nstate_dir = "{tmp}/state"\n'
            f"[privacy]\nface_detector = false\n[api]\nhttp_port = {port}\ngrpc_port = 0\n"
            + offload
        )
        env = {**os.environ, "PYTHONPATH": str(tree)}
        process = subprocess.Popen(
            [sys.executable, "-m", "edge_agent", "run", "--config", str(config)],
            env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    _get(port, "/v2/health/ready")
                    break
                except OSError:
                    if time.monotonic() > deadline or process.poll() is not None:
                        raise RuntimeError(f"the agent of {tree} did not start") from None
                    time.sleep(0.2)
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

            def flood(count: int, offset: int) -> None:
                for index in range(count):
                    name = f"unknown-{offset + index:07d}-".ljust(name_bytes, "x")
                    connection.request("POST", f"/v2/models/{name}/infer", body)
                    connection.getresponse().read()

            flood(200, 0)  # what is made once (a label, a cache) exists now
            before = {"rss_kb": _rss_kb(process.pid), "metrics_bytes": len(_get(port, "/metrics"))}
            started = time.monotonic()
            flood(names, 200)
            seconds = time.monotonic() - started
            after = {"rss_kb": _rss_kb(process.pid), "metrics_bytes": len(_get(port, "/metrics"))}
            connection.close()
        finally:
            process.terminate()
            process.wait(30)
    return {
        "tree": str(tree),
        "names": names,
        "before": before,
        "after": after,
        "rss_growth_kb": after["rss_kb"] - before["rss_kb"],
        "metrics_growth_bytes": after["metrics_bytes"] - before["metrics_bytes"],
        "requests_per_s": round(names / seconds, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, action="append",
                        help="a checkout to measure (repeatable; default: this one)")  # fmt: skip
    parser.add_argument("--names", type=int, default=20_000)
    parser.add_argument("--no-gateway", action="store_true", help="no offload")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    trees = [tree.resolve() for tree in (args.tree or [ROOT])]
    if args.no_gateway:
        results = [measure(tree, args.names, None) for tree in trees]
    else:
        sys.path.insert(0, str(ROOT))
        from benchmarks.agent.hybrid import gateway_process

        with (
            tempfile.TemporaryDirectory(prefix="growth-gateway-") as state,
            gateway_process(ROOT / "models", Path(state)) as gateway,
        ):
            results = [measure(tree, args.names, gateway) for tree in trees]
    print(f"{'tree':50} {'names':>6} {'RSS +KiB':>9} {'/metrics before':>16} {'after':>10}")
    for r in results:
        print(f"{r['tree']:50} {r['names']:>6} {r['rss_growth_kb']:>9} "
              f"{r['before']['metrics_bytes']:>16} {r['after']['metrics_bytes']:>10}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
