"""The signed metadata of one update check: python-tuf behind a small face.

:func:`refresh` runs python-tuf's refresh (signatures from the trusted root,
versions never going back, nothing expired, snapshot consistency) and returns
a :class:`SignedMetadata` to ask about targets. python-tuf's exceptions are
translated here, and only here, into :mod:`edge_core.errors`.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from edge_agent.ota.fetch import UNPACED, GatewayFetcher, Pace
from edge_core.errors import (
    CorruptDownload,
    DownloadError,
    DownloadStalled,
    IntegrityError,
    MetadataError,
    NoKeyError,
)
from edge_core.ota.plan import payload_target

__all__ = ["SignedMetadata", "refresh"]


def refresh(
    *,
    url: str,
    client: Any,
    metadata_dir: Path,
    downloads: Path,
    trusted_root: bytes | None,
    timeout_s: float,
    expiry_slack_s: float = 0.0,
    pace: Pace = UNPACED,
) -> SignedMetadata:
    """The repository's current metadata, verified from the cached (or enrolled) root.

    Every metadata file (and later every key file) is fetched at ``pace`` at least.

    Raises:
        MetadataError: no trusted root, or the metadata fails verification.
        DownloadStalled: a metadata file came slower than ``pace`` allows.
        DownloadError: the metadata cannot be fetched.
    """
    from tuf.api import exceptions
    from tuf.ngclient import Updater, UpdaterConfig

    cached = metadata_dir / "root.json"
    bootstrap = None if cached.is_file() else trusted_root
    if bootstrap is None and not cached.is_file():
        raise MetadataError("no trusted root: the enrollment bundle has none and none is cached")
    base = url.rstrip("/")
    try:
        updater = Updater(
            metadata_dir=str(metadata_dir),
            metadata_base_url=f"{base}/v2/ota/metadata/",
            target_base_url=f"{base}/v2/ota/targets/",
            target_dir=str(downloads),
            fetcher=GatewayFetcher(client, timeout=timeout_s, pace=pace),
            config=UpdaterConfig(),
            bootstrap=bootstrap,
        )
        if expiry_slack_s:
            allow_expiry_slack(updater, expiry_slack_s)
        updater.refresh()
    except exceptions.RepositoryError as exc:
        raise MetadataError(f"the update metadata failed verification: {exc}") from exc
    except exceptions.SlowRetrievalError as exc:
        raise DownloadStalled(f"cannot fetch the update metadata: {exc}") from exc
    except exceptions.DownloadError as exc:
        raise DownloadError(f"cannot fetch the update metadata: {exc}") from exc
    return SignedMetadata(updater, downloads)


class SignedMetadata:
    """Targets as the verified metadata describes them."""

    def __init__(self, updater: Any, downloads: Path) -> None:
        self._updater = updater
        self._downloads = downloads

    def target(self, path: str) -> Any:
        """The signed ``TargetFile`` at ``path``, or ``None`` if the metadata has none.

        Raises:
            MetadataError: the targets metadata fails verification.
        """
        from tuf.api import exceptions

        try:
            return self._updater.get_targetinfo(path)
        except exceptions.RepositoryError as exc:
            raise MetadataError(f"the targets metadata failed verification: {exc}") from exc

    def withdrawal(self, name: str, version: int) -> str | None:
        """Why the signed metadata takes ``name`` ``version`` back, or ``None`` if it offers it.

        Taken back: no longer listed, or marked ``"withdrawn": true`` in its
        custom fields (``cloud-gateway models withdraw``).
        """
        info = self.target(payload_target(name, version))
        if info is None:
            return f"v{version} is no longer in the signed metadata"
        if (info.custom or {}).get("withdrawn") is True:
            return f"v{version} is withdrawn in the signed metadata"
        return None

    def fetch_key(self, key_info: Any, group: str) -> dict[str, Any]:
        """A wrapped data key file, checked against its signed length and hashes.

        Raises:
            NoKeyError: the gateway has no key file for ``group``.
            DownloadStalled: it came slower than the pace allows.
            DownloadError: it cannot be fetched.
            CorruptDownload: it does not match its signed length and hashes.
            IntegrityError: it is not a key file.
        """
        from tuf.api import exceptions

        try:
            path = self._updater.download_target(key_info, str(self._downloads / "key.json"))
        except exceptions.DownloadHTTPError as exc:
            if exc.status_code in (403, 404):
                raise NoKeyError(f"the gateway has no data key for group {group!r}") from exc
            raise DownloadError(f"cannot fetch the data key: {exc}") from exc
        except exceptions.SlowRetrievalError as exc:
            raise DownloadStalled(f"cannot fetch the data key: {exc}") from exc
        except exceptions.DownloadError as exc:
            raise DownloadError(f"cannot fetch the data key: {exc}") from exc
        except exceptions.RepositoryError as exc:
            raise CorruptDownload(
                f"the data key file does not match its signed length and hash: {exc}"
            ) from exc
        try:
            document = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise IntegrityError(f"the data key file is not JSON: {exc}") from exc
        finally:
            Path(path).unlink(missing_ok=True)
        if not isinstance(document, dict):
            raise IntegrityError("the data key file is not a JSON object")
        return document


def allow_expiry_slack(updater: Any, seconds: float) -> None:
    """Judge expiry ``seconds`` in the past, for a device without a real-time clock.

    python-tuf judges expiry against the time its trusted metadata set was made
    (``TrustedMetadataSet.reference_time``, set to now when the ``Updater`` is made) and
    has no public way to change it, so this is the one place that reaches into its
    private state. It is pinned to the versions ``pyproject.toml`` allows (``tuf>=5,<8``):
    ``tests/e2e/test_ota_rollouts.py`` checks that the attribute is still where it was, and that an
    expired timestamp verifies within the slack.
    """
    trusted = updater._trusted_set
    trusted.reference_time -= timedelta(seconds=seconds)
