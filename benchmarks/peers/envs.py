"""Virtual environments of the peers, made on demand and cached, never the project's.

Each peer pins its own FastAPI, pydantic, protobuf and gRPC: beside the project's
they would fight. :func:`ensure_env` makes ``<cache>/<name>`` with a given
interpreter and requirements the first time (a minute or two, from the package
registry), marks it complete, and reuses it afterwards; a half-made one (no
marker: an install cut short) is made again. Several processes may ask at once
(test workers): one installs, the others wait on a lock file. Starting a peer and
waiting for its model to be ready is here too (:func:`wait_ready`), for every
peer alike.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.peers import PeerUnavailable

__all__ = ["CACHE", "ensure_env", "installed", "wait_ready"]

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edge-inference"
MARKER = ".installed"
INSTALL_TIMEOUT_S = 1800.0


def installed(name: str, cache: Path = CACHE) -> bool:
    """Whether the environment ``name`` is already made (nothing is installed here)."""
    return (cache / name / MARKER).is_file()


def _tail(path: Path, size: int = 1500) -> str:
    try:
        return path.read_bytes()[-size:].decode("utf-8", "replace").strip()
    except OSError:
        return ""


def ensure_env(
    name: str,
    requirements: Sequence[str],
    *,
    python: str | None = None,
    cache: Path = CACHE,
) -> Path:
    """The folder of the cached environment ``name``, made with ``python`` (default:
    the interpreter that runs this) and ``requirements`` when missing.

    Raises:
        PeerUnavailable: the interpreter is missing, or the environment or its
            packages cannot be installed (the message has the installer's last lines).
    """
    env = cache / name
    marker = env / MARKER
    wanted = "\n".join(requirements) + "\n"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file():  # the name carries the version: what is in it stays
            return env
        base = str(python or getattr(sys, "_base_executable", sys.executable))
        if not Path(base).is_file():
            raise PeerUnavailable(f"{name}: the interpreter {base} is not installed here")
        log = cache / f"{name}.install.log"
        steps = [
            [base, "-m", "venv", "--clear", str(env)],
            [str(env / "bin" / "python"), "-m", "pip", "install", "--quiet", *requirements],
        ]
        print(f"installing {name} ({' '.join(requirements)}) into {env} ...", file=sys.stderr)
        with open(log, "wb") as out:
            for step in steps:
                try:
                    subprocess.run(
                        step, stdout=out, stderr=subprocess.STDOUT, check=True,
                        timeout=INSTALL_TIMEOUT_S,
                    )  # fmt: skip
                except (OSError, subprocess.SubprocessError) as exc:
                    hint = ""
                    if step[1:3] == ["-m", "venv"]:
                        hint = " (Debian: apt-get install python3-venv)"
                    raise PeerUnavailable(
                        f"{name}: `{' '.join(step[:4])} ...` failed{hint}: {exc}; "
                        f"{log}: {_tail(log)}"
                    ) from exc
        marker.write_text(wanted)
    return env


def wait_ready(
    process: subprocess.Popen[Any],
    http_port: int,
    paths: Sequence[str],
    *,
    what: str,
    log: Path | None,
    timeout: float = 120.0,
) -> None:
    """Wait until ``process`` answers 200 on each of ``paths`` (readiness URLs) over HTTP.

    Raises:
        PeerUnavailable: it exited, or was not ready within ``timeout`` (it is killed).
    """
    end = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            said = _tail(log) if log is not None else ""
            raise PeerUnavailable(f"{what} exited with {process.returncode} (log {log}): {said}")
        try:
            for path in paths:
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}{path}", timeout=1):
                    pass
            return
        except OSError:
            if time.monotonic() > end:
                process.kill()
                process.wait()
                raise PeerUnavailable(
                    f"{what} was not ready within {timeout:g} s (log {log})"
                ) from None
            time.sleep(0.2)
