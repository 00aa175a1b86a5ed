"""Fetching for updates: signed metadata through python-tuf, blobs with resume.

:class:`GatewayFetcher` is python-tuf's fetcher seam (``_fetch`` yields the
bytes of a URL; python-tuf's public ``fetch`` wraps it so callers only see
its own download errors), talking to the gateway with the device's token.
:func:`download_resumable` brings a blob to a file: it resumes a cut
download with an HTTP ``Range`` request from the bytes already there, never
takes more than the length the signed metadata declares (a longer stream is
refused as soon as the server announces or sends it), and can be held to a
bandwidth cap. :func:`fetch_plan` reads the gateway's (unsigned) plan, never
more than :data:`~edge_agent.ota.plan.MAX_PLAN_BYTES` of it. httpx's
exceptions are translated here.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from edge_agent.errors import DownloadError
from edge_agent.ota.plan import MAX_PLAN_BYTES

__all__ = ["GatewayFetcher", "download_resumable", "fetch_plan"]

CHUNK = 1 << 20


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
            with self.client.stream("GET", url, timeout=self.timeout) as response:
                if response.status_code != 200:
                    raise exceptions.DownloadHTTPError(
                        f"GET {url}: {response.status_code}", response.status_code
                    )
                yield from response.iter_bytes(CHUNK)
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
        with client.stream(
            "GET", "/v2/ota/plan", headers={"accept-encoding": "identity"}, timeout=timeout
        ) as response:
            encoding = response.headers.get("content-encoding", "identity")
            if encoding != "identity":
                raise DownloadError(f"the update plan came {encoding}-encoded; refused")
            for chunk in response.iter_bytes():  # not decoded: it is unencoded
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
            or the server sent, or announced, more than ``length`` bytes.
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
        with client.stream("GET", url, headers=headers, timeout=timeout) as response:
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
                raise DownloadError(
                    f"GET {url}: the server offers {have + offered} bytes, but the signed "
                    f"metadata says {length}; refused (endless data)"
                )
            with target.open(mode) as out:
                for chunk in response.iter_bytes():  # as it arrives: a cut loses nothing
                    if have + len(chunk) > length:
                        raise DownloadError(
                            f"GET {url}: more than the {length} bytes the signed metadata "
                            "declares; refused (endless data)"
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
