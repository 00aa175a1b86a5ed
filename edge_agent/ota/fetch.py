"""Fetching for updates: signed metadata through python-tuf, blobs with resume.

:class:`GatewayFetcher` is python-tuf's fetcher seam (``_fetch`` yields the
bytes of a URL; python-tuf's public ``fetch`` wraps it so callers only see
its own download errors), talking to the gateway with the device's token.
:func:`download_resumable` brings a blob to a file: it resumes a cut
download with an HTTP ``Range`` request from the bytes already there, never
takes more than the length the signed metadata declares (a longer stream is
refused as soon as the server announces or sends it), and can be held to a
bandwidth cap. :func:`fetch_plan` reads the gateway's (unsigned) plan, never
more than :data:`~edge_core.ota.plan.MAX_PLAN_BYTES` of it. httpx's
exceptions are translated here.

Every request asks for the body unencoded (``Accept-Encoding: identity``),
any other ``Content-Encoding`` in the answer is refused before a byte is read,
and bodies are read raw (:func:`_unencoded`): each byte limit counts the bytes
on the wire, so a few hundred compressed bytes can never become hundreds of
megabytes in memory before a limit sees them (a compression bomb).

Every download, of a blob, a key file or metadata, is held to a :class:`Pace`:
a minimum rate averaged over each window, and a deadline from its length
(signed, or python-tuf's maximum for metadata) at that rate. One that falls
behind is abandoned (:class:`~edge_core.errors.DownloadStalled`; a blob's
bytes are kept for the next check to resume), so a server that drips bytes
cannot hold the update, and its lock, for hours. A part that cannot be
written (no space, a file-size limit) is a
:class:`~edge_core.errors.StorageError`, and what was written is removed.
"""

from __future__ import annotations

import errno
import hashlib
import math
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from edge_core.errors import DownloadError, DownloadRefused, DownloadStalled, StorageError
from edge_core.ota.plan import MAX_PLAN_BYTES

__all__ = [
    "UNPACED",
    "GatewayFetcher",
    "Pace",
    "RateWatch",
    "download_resumable",
    "fetch_plan",
]

CHUNK = 1 << 20
IDENTITY = {"accept-encoding": "identity"}
# a write that fails for want of room: what was written is removed, the space is needed
NO_ROOM = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})


@dataclass(frozen=True)
class Pace:
    """The least a download must keep up: ``min_rate`` bytes per second, averaged over
    each ``window_s``, and done by its deadline, ``window_s`` plus its length at
    ``min_rate`` after it started. ``min_rate`` 0: no minimum and no deadline."""

    min_rate: int = 0
    window_s: float = 60.0

    def deadline(self, started: float, length: int) -> float:
        """When a download of ``length`` bytes begun at ``started`` must be done. Pure."""
        if not self.min_rate:
            return math.inf
        return started + self.window_s + length / self.min_rate


UNPACED = Pace()  # no minimum rate, no deadline


class RateWatch:
    """One download held to its :class:`Pace` and deadline. Pure: the caller passes the
    time and the bytes received, and abandons the download when :meth:`lag` says why."""

    def __init__(self, pace: Pace, started: float, deadline: float) -> None:
        self.pace = pace
        self.started = started
        self.deadline = deadline
        self._since, self._mark = started, 0  # the current window: its start, its bytes

    def lag(self, received: int, now: float) -> str | None:
        """Why the download must be abandoned, ``received`` bytes in at ``now``, or ``None``."""
        if now > self.deadline:
            return f"past its deadline of {self.deadline - self.started:.1f} s"
        elapsed = now - self._since
        if self.pace.min_rate and elapsed >= self.pace.window_s:
            rate = (received - self._mark) / elapsed
            if rate < self.pace.min_rate:
                return (
                    f"{rate:.0f} bytes/s over the last {elapsed:.1f} s, below the minimum "
                    f"of {self.pace.min_rate} bytes/s"
                )
            self._since, self._mark = now, received
        return None

    def timeout(self, per_read: float, now: float) -> float:
        """The read timeout to ask for at ``now``: never past the deadline by more than
        it had left then."""
        return max(0.01, min(per_read, self.deadline - now))


@contextmanager
def _unencoded(
    client: Any,
    url: str,
    *,
    what: str,
    timeout: float,
    headers: dict[str, str] | None = None,
) -> Iterator[Any]:
    """``GET url`` as a stream, asked for and accepted only without a content encoding.

    Read the body with :func:`_raw`: the bytes as sent, so that a caller's
    byte limit holds for what crosses the wire.

    Raises:
        DownloadError: the answer comes with a ``Content-Encoding`` other than
            ``identity`` (``what`` names the body in the message).
        httpx.HTTPError: the request failed (the caller translates it).
    """
    with client.stream("GET", url, headers={**(headers or {}), **IDENTITY}, timeout=timeout) as (
        response
    ):
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise DownloadRefused(
                f"{what} came {encoding}-encoded although only an unencoded body was asked "
                "for; refused (a compressed body could grow past its length limit)"
            )
        yield response


def _raw(response: Any, chunk_size: int | None = None) -> Iterator[bytes]:
    """The body of an unencoded response as it arrives (never decoded, never buffered).

    A response made with its body in memory (an ``httpx`` transport of the
    tests' own) has nothing left to stream: its body is that.
    """
    if response.is_stream_consumed:
        yield response.content
        return
    yield from response.iter_raw(chunk_size)


def _fetcher_base() -> Any:
    from tuf.ngclient.fetcher import FetcherInterface

    return FetcherInterface


class GatewayFetcher(_fetcher_base()):  # type: ignore[misc]
    """python-tuf's fetcher over one keep-alive ``httpx.Client``, each download held to
    ``pace`` (its deadline from the maximum length python-tuf allows it)."""

    def __init__(
        self,
        client: Any,
        *,
        timeout: float = 30.0,
        pace: Pace = UNPACED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.timeout = timeout
        self.pace = pace
        self.clock = clock
        self._max_length = 0

    @contextmanager
    def download_file(self, url: str, max_length: int) -> Iterator[IO[bytes]]:
        """python-tuf's download, unchanged; only the length it allows is noted (the
        deadline of :meth:`_fetch` comes from it)."""
        self._max_length = max_length
        with super().download_file(url, max_length) as file:
            yield file

    def _fetch(self, url: str) -> Iterator[bytes]:
        import httpx
        from tuf.api import exceptions

        started = self.clock()
        watch = RateWatch(self.pace, started, self.pace.deadline(started, self._max_length))
        received = 0
        try:
            with _unencoded(
                self.client, url, what=f"GET {url}", timeout=watch.timeout(self.timeout, started)
            ) as response:
                if response.status_code != 200:
                    raise exceptions.DownloadHTTPError(
                        f"GET {url}: {response.status_code}", response.status_code
                    )
                for chunk in _raw(response):  # python-tuf counts these against its limit
                    received += len(chunk)
                    why = watch.lag(received, self.clock())
                    if why is not None:
                        raise exceptions.SlowRetrievalError(
                            f"GET {url}: abandoned after {received} bytes, {why} (ota.min_rate)"
                        )
                    yield chunk
        except DownloadError as exc:
            raise exceptions.DownloadError(str(exc)) from exc
        except httpx.TimeoutException as exc:
            raise exceptions.SlowRetrievalError(f"GET {url} timed out") from exc
        except httpx.HTTPError as exc:
            raise exceptions.DownloadError(f"GET {url}: {exc}") from exc


def fetch_plan(
    client: Any,
    *,
    timeout: float = 30.0,
    pace: Pace = UNPACED,
    clock: Callable[[], float] = time.monotonic,
) -> bytes:
    """The body of ``GET /v2/ota/plan``, read as it arrives and cut at :data:`MAX_PLAN_BYTES`,
    at ``pace`` at least (its deadline from that cap).

    Asked for and accepted only unencoded: a compressed body could grow past
    the cap in one decoded piece.

    Raises:
        DownloadStalled: it came slower than ``pace`` allows.
        DownloadError: the gateway cannot be reached or answers an error, the
            body is over the cap, or it comes compressed.
    """
    import httpx

    body = bytearray()
    started = clock()
    watch = RateWatch(pace, started, pace.deadline(started, MAX_PLAN_BYTES))
    try:
        with _unencoded(
            client, "/v2/ota/plan", what="the update plan", timeout=watch.timeout(timeout, started)
        ) as response:
            for chunk in _raw(response):
                body += chunk
                if len(body) > MAX_PLAN_BYTES:
                    raise DownloadError(f"the update plan is over {MAX_PLAN_BYTES} bytes; refused")
                why = watch.lag(len(body), clock())
                if why is not None:
                    raise DownloadStalled(
                        f"the update plan: abandoned after {len(body)} bytes, {why} (ota.min_rate)"
                    )
    except httpx.HTTPError as exc:
        raise DownloadError(f"cannot reach the gateway for the update plan: {exc}") from exc
    if response.status_code != 200:
        text = bytes(body[:200]).decode(errors="replace")
        raise DownloadError(f"the update plan: HTTP {response.status_code}: {text}")
    return bytes(body)


def download_resumable(
    client: Any,
    url: str,
    target: Path,
    length: int,
    *,
    timeout: float = 30.0,
    bandwidth: int | None = None,
    pace: Pace = UNPACED,
    deadline: float | None = None,
    on_chunk: Callable[[int], None] = lambda done: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Bring ``target`` to ``length`` bytes from ``url``, resuming from what it holds.

    Returns the file's SHA-256 (hex), computed as the bytes arrive (the bytes
    kept from an earlier, cut attempt are hashed first): the blob is read once.
    ``on_chunk`` is called with the bytes held after each chunk is written.
    The download is held to ``pace``, and to ``deadline`` (on ``clock``; by
    default the pace's deadline for the bytes still missing).

    Raises:
        DownloadStalled: it fell below the pace's minimum rate or ran past the
            deadline (the bytes received are kept: call again to resume).
        DownloadError: the connection failed or was cut (call again to resume),
            the server sent, or announced, more than ``length`` bytes, or it
            sent the blob with a content encoding.
        StorageError: ``target`` cannot be written (no space, a file-size
            limit: what was written is removed).
    """
    part = _Part(target, length)
    if part.have == length:
        return part.digest.hexdigest()
    headers = {"Range": f"bytes={part.have}-"} if part.have else {}
    started = clock()
    watch = RateWatch(
        pace,
        started,
        deadline if deadline is not None else pace.deadline(started, length - part.have),
    )
    throttle = _throttle(bandwidth, started, clock, sleep)
    with (
        _translated(url, part, watch, clock),
        _unencoded(
            client, url, what=f"GET {url}", timeout=watch.timeout(timeout, started), headers=headers
        ) as response,
    ):
        mode = _write_mode(response, url, part)
        _refuse_an_endless_offer(response, url, part)
        with target.open(mode) as out:
            for chunk in _raw(response):  # as it arrives: a cut loses nothing
                part.append(out, chunk, url)
                on_chunk(part.have)
                why = watch.lag(part.received, clock())
                if why is not None:
                    raise _stalled(url, part.have, length, why)
                throttle(len(chunk))
    if part.have < length:
        raise DownloadError(f"GET {url} was cut at byte {part.have} of {length}")
    return part.digest.hexdigest()


@contextmanager
def _translated(
    url: str, part: _Part, watch: RateWatch, clock: Callable[[], float]
) -> Iterator[None]:
    """A blob's download errors as this module's: httpx's, and a part that cannot be
    written (httpx's errors are not OSErrors).

    Raises:
        DownloadStalled: a read timed out at the deadline, or below the pace.
        DownloadError: the connection failed or was cut.
        StorageError: the part cannot be written.
    """
    import httpx

    try:
        yield
    except httpx.TimeoutException as exc:
        why = watch.lag(part.received, clock())  # a read timed out at the deadline
        if why is not None:
            raise _stalled(url, part.have, part.length, why) from exc
        raise DownloadError(
            f"GET {url} failed at byte {part.have} of {part.length}: {exc}"
        ) from exc
    except httpx.HTTPError as exc:
        raise DownloadError(
            f"GET {url} failed at byte {part.have} of {part.length}: {exc}"
        ) from exc
    except OSError as exc:
        raise part.unwritable(exc) from exc


class _Part:
    """A blob's part file on its way to the signed length: the bytes it holds (from an
    earlier, cut attempt too) and their SHA-256, so that the blob is read once."""

    def __init__(self, target: Path, length: int) -> None:
        self.target, self.length = target, length
        self.have = target.stat().st_size if target.exists() else 0
        if self.have > length:  # longer than the blob: not a part of it
            target.unlink()
            self.have = 0
        self.digest = hashlib.sha256()
        if self.have:
            with target.open("rb") as kept:
                for block in iter(lambda: kept.read(CHUNK), b""):
                    self.digest.update(block)
        self.received = 0  # on this connection

    def restart(self) -> None:
        """From the first byte again: the server sent the whole blob."""
        self.have, self.digest = 0, hashlib.sha256()

    def append(self, out: IO[bytes], chunk: bytes, url: str) -> None:
        """Write ``chunk`` through to the file (a cut loses nothing written).

        Raises:
            DownloadRefused: it goes past the signed length (endless data).
        """
        if self.have + len(chunk) > self.length:
            raise DownloadRefused(
                f"GET {url}: more than the {self.length} bytes the signed metadata "
                "declares; refused (endless data)",
                discard=True,
            )
        out.write(chunk)
        self.digest.update(chunk)
        self.have += len(chunk)
        self.received += len(chunk)
        out.flush()

    def unwritable(self, exc: OSError) -> StorageError:
        """The error of a part that cannot be written; one that fails for want of room is
        removed, the space is needed."""
        if exc.errno in NO_ROOM:
            self.target.unlink(missing_ok=True)
            return StorageError(
                f"cannot write {self.target} at byte {self.have} of {self.length}: "
                f"{exc.strerror}; what was written is removed, and the next check tries again"
            )
        return StorageError(f"cannot write {self.target}: {exc.strerror}")


def _write_mode(response: Any, url: str, part: _Part) -> str:
    """How the part is written: appended where the server resumed (``206`` at the
    part's length), or from the start when it sent the whole blob (``200``).

    Raises:
        DownloadError: it resumed elsewhere, or answered anything else.
    """
    if response.status_code == 206 and part.have:
        if not response.headers.get("content-range", "").startswith(f"bytes {part.have}-"):
            raise DownloadError(f"GET {url}: the server resumed at the wrong offset")
        return "ab"
    if response.status_code == 200:
        part.restart()  # the server ignored the range: start over
        return "wb"
    raise DownloadError(f"GET {url}: HTTP {response.status_code}")


def _refuse_an_endless_offer(response: Any, url: str, part: _Part) -> None:
    """A server that announces more than the signed length is refused before a byte.

    Raises:
        DownloadRefused: its ``Content-Length`` goes past the signed length.
    """
    announced = response.headers.get("content-length")
    offered = int(announced) if announced and re.fullmatch("[0-9]+", announced) else 0
    if part.have + offered > part.length:
        raise DownloadRefused(
            f"GET {url}: the server offers {part.have + offered} bytes, but the signed "
            f"metadata says {part.length}; refused (endless data)",
            discard=True,
        )


def _throttle(
    bandwidth: int | None,
    started: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> Callable[[int], None]:
    """A pause after each chunk while the bytes received since ``started`` are ahead of
    ``bandwidth`` bytes a second (``None`` or 0: no cap)."""
    sent = 0

    def pause(size: int) -> None:
        nonlocal sent
        if not bandwidth:
            return
        sent += size
        ahead = sent / bandwidth - (clock() - started)
        if ahead > 0:
            sleep(ahead)

    return pause


def _stalled(url: str, have: int, length: int, why: str) -> DownloadStalled:
    return DownloadStalled(
        f"GET {url}: abandoned at byte {have} of {length}, {why}; the {have} bytes are "
        "kept for the next check to resume (ota.min_rate)"
    )
