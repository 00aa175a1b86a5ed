"""Child processes and ports, for the commands that start servers of their own (the
benchmarks, the demo): a free port on loopback, and a stop as a service manager
does it."""

from __future__ import annotations

import socket
import subprocess
from typing import Any

__all__ = ["free_port", "stop_process"]


def stop_process(process: subprocess.Popen[Any], timeout: float = 10.0) -> int:
    """Stop a child process as a service manager would: SIGTERM, then SIGKILL after
    ``timeout`` seconds; its exit status."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return int(process.returncode)


def free_port() -> int:
    """A TCP port free on loopback now (for a server started next)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
