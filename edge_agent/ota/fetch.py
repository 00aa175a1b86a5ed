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
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from edge_core.errors import DownloadError, DownloadRefused
from edge_core.ota.plan import MAX_PLAN_BYTES

__all__ = ["GatewayFetcher", "download_resumable", "fetch_plan"]

CHUNK = 1 << 20
IDENTITY = {"accept-encoding": "identity"}


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
    """python-tuf's fetcher over one keep-alive ``httpx.Client``."""

    def __init__(self, client: Any, *, timeout: float = 30.0) -> None:
        self.client = client
        self.timeout = timeout

    def _fetch(self, url: str) -> Iterator[bytes]:
        import httpx
        from tuf.api import exceptions

        try:
            with _unencoded(self.client, url, what=f"GET {url}", timeout=self.timeout) as response:
                if response.status_code != 200:
                    raise exceptions.DownloadHTTPError(
                        f"GET {url}: {response.status_code}", response.status_code
                    )
                yield from _raw(response, CHUNK)  # python-tuf counts these against its limit
        except DownloadError as exc:
            raise exceptions.DownloadError(str(exc)) from exc
        except httpx.TimeoutException as exc:
            raise exceptions.SlowRetrievalError(f"GET {url} timed out") from exc
        except httpx.HTTPError as exc:
            raise exceptions.DownloadError(f"GET {url}: {exc}") from exc


def fetch_plan(client: Any, *, timeout: float = 30.0) -> bytes:
    """The body of ``GET /v2/ota/plan``, read as it arrives and cut at :data:`MAX_PLAN_BYTES`.

    Asked for and accepted only unencoded: a compressed body could grow past
    the cap in one decoded piece.

    Raises:
        DownloadError: the gateway cannot be reached or answers an error, the
            body is over the cap, or it comes compressed.
    """
    import httpx

    body = bytearray()
    try:
        with _unencoded(
            client, "/v2/ota/plan", what="the update plan", timeout=timeout
        ) as response:
            for chunk in _raw(response):
                body += chunk
                if len(body) > MAX_PLAN_BYTES:
                    raise DownloadError(f"the update plan is over {MAX_PLAN_BYTES} bytes; refused")
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
    on_chunk: Callable[[int], None] = lambda done: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Bring ``target`` to ``length`` bytes from ``url``, resuming from what it holds.

    Returns the file's SHA-256 (hex), computed as the bytes arrive (the bytes
    kept from an earlier, cut attempt are hashed first): the blob is read once.
    ``on_chunk`` is called with the bytes held after each chunk is written.

    Raises:
        DownloadError: the connection failed or was cut (call again to resume),
            the server sent, or announced, more than ``length`` bytes, or it
            sent the blob with a content encoding.
    """
    import httpx

    have = target.stat().st_size if target.exists() else 0
    if have > length:
        target.unlink()
        have = 0
    digest = hashlib.sha256()
    if have:
        with target.open("rb") as kept:
            for block in iter(lambda: kept.read(CHUNK), b""):
                digest.update(block)
    if have == length:
        return digest.hexdigest()
    headers = {"Range": f"bytes={have}-"} if have else {}
    started, sent_since = clock(), 0
    try:
        with _unencoded(
            client, url, what=f"GET {url}", timeout=timeout, headers=headers
        ) as response:
            if response.status_code == 206 and have:
                if not response.headers.get("content-range", "").startswith(f"bytes {have}-"):
                    raise DownloadError(f"GET {url}: the server resumed at the wrong offset")
                mode = "ab"
            elif response.status_code == 200:
                have, mode = 0, "wb"  # the server ignored the range: start over
                digest = hashlib.sha256()
            else:
                raise DownloadError(f"GET {url}: HTTP {response.status_code}")
            announced = response.headers.get("content-length")
            offered = int(announced) if announced and re.fullmatch("[0-9]+", announced) else 0
            if have + offered > length:
                raise DownloadRefused(
                    f"GET {url}: the server offers {have + offered} bytes, but the signed "
                    f"metadata says {length}; refused (endless data)",
                    discard=True,
                )
            with target.open(mode) as out:
                for chunk in _raw(response):  # as it arrives: a cut loses nothing
                    if have + len(chunk) > length:
                        raise DownloadRefused(
                            f"GET {url}: more than the {length} bytes the signed metadata "
                            "declares; refused (endless data)",
                            discard=True,
                        )
                    out.write(chunk)
                    digest.update(chunk)
                    have += len(chunk)
                    out.flush()
                    on_chunk(have)
                    if bandwidth:
                        sent_since += len(chunk)
                        ahead = sent_since / bandwidth - (clock() - started)
                        if ahead > 0:
                            sleep(ahead)
    except httpx.HTTPError as exc:
        raise DownloadError(f"GET {url} failed at byte {have} of {length}: {exc}") from exc
    if have < length:
        raise DownloadError(f"GET {url} was cut at byte {have} of {length}")
    return digest.hexdigest()
