"""systemd's notify protocol, written out (no libsystemd, no extra package).

Under ``Type=notify`` systemd passes the agent a datagram socket in
``NOTIFY_SOCKET`` (a path, or a name in the abstract namespace when it starts
with ``@``) and waits for ``READY=1`` before ``systemctl start`` returns. Each
message is one datagram of ``KEY=value`` lines. The daemon's life, as systemd
sees it::

    ready()                 models loaded, API listening        READY=1
    status("...")           free text for `systemctl status`    STATUS=...
    reloading() / reloaded()  SIGHUP: re-reading the config      RELOADING=1 ... READY=1
    stopping()              SIGTERM: draining                   STOPPING=1

With ``WatchdogSec=`` systemd also sets ``WATCHDOG_USEC`` and kills the
service unless it hears ``WATCHDOG=1`` within that time. A watchdog that
pings from a timer alone proves only that the timer runs, so
:meth:`Notifier.start_watchdog` pings every ``WATCHDOG_USEC / 2`` only while
the daemon's own health check passes: a wedged daemon falls silent and is
restarted.

Outside systemd (``NOTIFY_SOCKET`` unset) every call is a no-op. Sending
never raises into the daemon: a failure (the socket gone, systemd busy) is
logged once per outage. Only a malformed environment, found when the
:class:`Notifier` is made at start, raises.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType

from edge_core.errors import ConfigError

__all__ = ["Notifier"]

log = logging.getLogger(__name__)

# A send blocks only if systemd stops reading; better a logged failure than a hung daemon.
_SEND_TIMEOUT_S = 2.0
# How long stop() waits for the watchdog thread, which may be inside a hung health check.
_JOIN_TIMEOUT_S = 5.0


class Notifier:
    """Tells systemd how the agent is doing; does nothing when not run by systemd.

    Reads systemd's variables from ``environ`` (default: ``os.environ``) once,
    here; ``pid`` (default: ``os.getpid()``) is this process, for
    ``WATCHDOG_PID``. As ``sd_watchdog_enabled(3)``: the watchdog is on when
    ``WATCHDOG_USEC`` is set and ``WATCHDOG_PID`` is unset or this process (a
    child that inherited its parent's environment must not ping for it).
    Every method may be called from any thread; each returns whether the
    message went out.

    Raises:
        ConfigError: ``NOTIFY_SOCKET`` is neither an absolute path nor an ``@``
            name (such as systemd 254's ``vsock:``, which this module does not
            speak), or ``WATCHDOG_USEC`` / ``WATCHDOG_PID`` are not positive integers.
    """

    def __init__(self, environ: Mapping[str, str] | None = None, *, pid: int | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET") or None
        if address is not None and not address.startswith(("/", "@")):
            raise ConfigError(
                f"expected an absolute socket path or an abstract name starting with '@', "
                f"got {address!r}",
                field="NOTIFY_SOCKET",
            )
        watchdog_usec = _positive_int(env, "WATCHDOG_USEC")
        watchdog_pid = _positive_int(env, "WATCHDOG_PID")
        if watchdog_pid is not None and watchdog_pid != (os.getpid() if pid is None else pid):
            watchdog_usec = None
        #: ``NOTIFY_SOCKET``, or ``None`` outside systemd.
        self.address = address
        #: ``WATCHDOG_USEC`` when the watchdog is this process's (and there is a socket).
        self.watchdog_usec = watchdog_usec if address is not None else None
        self._sockaddr = address
        if address is not None and address.startswith("@"):
            # Linux's abstract namespace: a leading NUL byte where systemd writes '@'.
            self._sockaddr = "\0" + address[1:]
        self._failing = False
        # Each watchdog thread gets its own stop event: one left behind in a hung health
        # check by stop() must not be revived by the next start_watchdog().
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        """Whether there is a systemd to tell."""
        return self.address is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between pings (half of ``WATCHDOG_USEC``, as systemd advises), or ``None``."""
        return None if self.watchdog_usec is None else self.watchdog_usec / 2e6

    def ready(self, status: str | None = None) -> bool:
        """Startup is done: ``READY=1``.

        No ``MAINPID=``: the agent is the process systemd started
        (``NotifyAccess=main``), so systemd already knows its PID.
        """
        return self._send("READY=1", *_status(status))

    def status(self, text: str) -> bool:
        """A line for ``systemctl status``: ``STATUS=``."""
        return self._send(*_status(text))

    def reloading(self, status: str | None = None) -> bool:
        """A reload began: ``RELOADING=1`` with ``MONOTONIC_USEC=`` (CLOCK_MONOTONIC, µs).

        systemd 253+ needs the timestamp to match the message to the reload it
        asked for (``Type=notify-reload``); older versions ignore it. Follow
        with :meth:`reloaded`.
        """
        now_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self._send("RELOADING=1", f"MONOTONIC_USEC={now_usec}", *_status(status))

    def reloaded(self, status: str | None = None) -> bool:
        """The reload is done: ``READY=1`` again."""
        return self._send("READY=1", *_status(status))

    def stopping(self, status: str | None = None) -> bool:
        """Shutdown began: ``STOPPING=1``."""
        return self._send("STOPPING=1", *_status(status))

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for ``seconds`` more before the start (or stop) times out: ``EXTEND_TIMEOUT_USEC=``.

        For a start that legitimately takes long, such as building TensorRT
        engines on a Jetson; repeat before each extension runs out.
        """
        return self._send(f"EXTEND_TIMEOUT_USEC={max(0, round(seconds * 1e6))}")

    def watchdog(self) -> bool:
        """One watchdog ping: ``WATCHDOG=1``."""
        return self._send("WATCHDOG=1")

    def start_watchdog(self, healthy: Callable[[], bool]) -> bool:
        """Ping the watchdog from a daemon thread while ``healthy()`` returns True.

        ``healthy`` is called from that thread before every ping, so it must be
        thread-safe and quick; an exception counts as unhealthy. Returns False
        (and starts nothing) when there is no watchdog.

        Raises:
            RuntimeError: the watchdog thread is already running.
        """
        interval = self.watchdog_interval
        if interval is None:
            return False
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("the watchdog thread is already running; call stop() first")
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._watch,
            args=(healthy, interval, self._stop),
            name="systemd-watchdog",
            daemon=True,
        )
        self._thread.start()
        return True

    def stop(self) -> None:
        """Stop the watchdog thread, if any. Notifications still work afterwards."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(_JOIN_TIMEOUT_S)

    def __enter__(self) -> Notifier:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _watch(self, healthy: Callable[[], bool], interval: float, stop: threading.Event) -> None:
        was_healthy = True
        while True:
            try:
                ok = bool(healthy())
            except Exception:
                if was_healthy:
                    log.exception("the health check raised; treating the agent as unhealthy")
                ok = False
            if stop.is_set():  # stopped while the health check ran
                return
            if ok:
                self.watchdog()
                if not was_healthy:
                    log.warning("the agent is healthy again; watchdog pings resumed")
            elif was_healthy:
                log.warning(
                    "the agent is unhealthy; withholding watchdog pings, so systemd restarts "
                    "it after %.0f s unless it recovers",
                    interval * 2,
                )
            was_healthy = ok
            if stop.wait(interval):
                return

    def _send(self, *lines: str) -> bool:
        if self._sockaddr is None or not lines:
            return False
        data = "\n".join(lines).encode("utf-8")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.settimeout(_SEND_TIMEOUT_S)
                sock.sendto(data, self._sockaddr)
        except OSError as exc:
            if not self._failing:
                log.warning(
                    "cannot notify systemd at NOTIFY_SOCKET=%s: %s (not logged again until a "
                    "notification gets through)",
                    self.address,
                    exc,
                )
            self._failing = True
            return False
        self._failing = False
        return True


def _status(text: str | None) -> tuple[str, ...]:
    if text is None:
        return ()
    # One line: a newline would end the field and let the text smuggle in others (READY=1).
    clean = "".join(" " if ord(char) < 32 or ord(char) == 127 else char for char in text)
    return (f"STATUS={clean}",)


def _positive_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"expected a positive integer, got {raw!r}", field=name)
    return value
