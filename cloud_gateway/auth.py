"""Device authentication: per-device bearer tokens, stored hashed, and rate limits.

A token is ``<device id>.<32 random bytes, base64url>``. The registry file
(``devices.json`` in the state directory, mode 0600) keeps only the SHA-256 of
each token: the tokens are 256-bit random values, so a fast hash is as strong
as a slow one here and lets every request be checked in microseconds. The
token is printed once, when the device is added, and never stored.

Each device also gets a Mosquitto-compatible hash of its token (its MQTT
password; see ``cloud-gateway mqtt acl``), made while the token is known.

The gateway re-reads the file when it changes (checked at most once a
second), so ``cloud-gateway device add`` and ``device revoke`` take effect on
a running gateway.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from edge_core.errors import ConfigError, RateLimited, Unauthenticated

__all__ = [
    "Device",
    "DeviceRegistry",
    "RateLimiter",
    "TokenBucket",
    "mosquitto_hash",
    "parse_bearer",
    "write_private",
]

DEVICE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
ROLES = ("device", "admin")


def write_private(path: Path, data: bytes, *, group: int | None = None) -> None:
    """Write ``data`` atomically to a file only its owner can read (mode 0600), or with
    ``group`` (a gid) its owner and that group (0640: a broker that drops to its own
    account reads its files through its group). Owner and mode are set before the file
    takes its name, so no reader ever sees it otherwise."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # a fresh, unguessable name, created here and now: in a shared folder nobody can
    # have put a file or a link there for this write to follow
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            if group is not None:
                try:
                    os.fchown(handle.fileno(), -1, group)
                except PermissionError:
                    raise ValueError(
                        f"cannot give {path.name} to group {group}: only root, or a member "
                        "of that group, can"
                    ) from None
                os.fchmod(handle.fileno(), 0o640)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def mosquitto_hash(password: str, *, iterations: int = 1000, salt: bytes | None = None) -> str:
    """``password`` as a line of Mosquitto's password file takes it (``$7$``:
    PBKDF2-HMAC-SHA512, a 12-byte salt), as ``mosquitto_passwd`` writes it."""
    salt = salt if salt is not None else secrets.token_bytes(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    encode = base64.b64encode
    return f"$7${iterations}${encode(salt).decode()}${encode(digest).decode()}"


def parse_bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` value, or ``None``."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


@dataclass(frozen=True)
class Device:
    id: str
    group: str
    role: str = "device"
    revoked: bool = False
    created: str = ""


class DeviceRegistry:
    """The devices allowed to call the gateway, backed by a JSON file."""

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._devices: dict[str, Device] = {}
        self._hashes: dict[str, str] = {}
        self._mqtt: dict[str, str] = {}
        self._stamp: tuple[int, int] | None = None
        self._checked = float("-inf")
        self._load()

    # -- file ---------------------------------------------------------------

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return None
        return stat.st_mtime_ns, stat.st_size

    def _load(self) -> None:
        stamp = self._file_stamp()
        devices: dict[str, Device] = {}
        hashes: dict[str, str] = {}
        mqtt: dict[str, str] = {}
        if stamp is not None:
            try:
                document = json.loads(self.path.read_text())
                for device_id, entry in document.get("devices", {}).items():
                    devices[device_id] = Device(
                        id=device_id,
                        group=str(entry["group"]),
                        role=str(entry.get("role", "device")),
                        revoked=bool(entry.get("revoked", False)),
                        created=str(entry.get("created", "")),
                    )
                    hashes[device_id] = str(entry["token_sha256"])
                    if "mqtt_password" in entry:
                        mqtt[device_id] = str(entry["mqtt_password"])
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ConfigError(
                    f"the device registry is unreadable: {exc}", path=self.path
                ) from exc
        self._devices, self._hashes, self._mqtt, self._stamp = devices, hashes, mqtt, stamp

    def _save(self) -> None:
        document: dict[str, Any] = {"version": 1, "devices": {}}
        for device_id, device in sorted(self._devices.items()):
            entry = asdict(device)
            del entry["id"]
            entry["token_sha256"] = self._hashes[device_id]
            if device_id in self._mqtt:
                entry["mqtt_password"] = self._mqtt[device_id]
            document["devices"][device_id] = entry
        write_private(self.path, (json.dumps(document, indent=2) + "\n").encode())
        self._stamp = self._file_stamp()

    def refresh(self, *, force: bool = False) -> None:
        """Re-read the file if it changed (at most once a second unless ``force``)."""
        now = self._clock()
        if not force and now - self._checked < 1.0:
            return
        self._checked = now
        if self._file_stamp() != self._stamp:
            # a half-written file from another tool: keep the last good registry
            with self._lock, contextlib.suppress(ConfigError):
                self._load()

    # -- administration -------------------------------------------------------

    def add(
        self, device_id: str, group: str, *, role: str = "device", replace: bool = False
    ) -> str:
        """Register a device and return its new token (shown once, stored hashed).

        Raises:
            ValueError: a malformed id, group or role, or an id already in use
                (unless ``replace``, which issues a new token and un-revokes).
        """
        if not DEVICE_ID.match(device_id):
            raise ValueError(
                f"device id {device_id!r} must be 1-64 letters, digits, '-' or '_' "
                "(starting with a letter or digit)"
            )
        if not DEVICE_ID.match(group):
            raise ValueError(f"group {group!r} must be 1-64 letters, digits, '-' or '_'")
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        with self._lock:
            self._load()
            if device_id in self._devices and not replace:
                raise ValueError(
                    f"device {device_id!r} already exists (use --replace for a new token)"
                )
            token = f"{device_id}.{secrets.token_urlsafe(32)}"
            created = datetime.now(timezone.utc).isoformat(timespec="seconds")
            self._devices[device_id] = Device(device_id, group, role, False, created)
            self._hashes[device_id] = _hash(token)
            self._mqtt[device_id] = mosquitto_hash(token)
            self._save()
        return token

    def revoke(self, device_id: str) -> Device:
        """Revoke a device's token.

        Raises:
            KeyError: no such device.
        """
        with self._lock:
            self._load()
            device = self._devices.get(device_id)
            if device is None:
                raise KeyError(f"no device {device_id!r} in {self.path}")
            revoked = Device(device.id, device.group, device.role, True, device.created)
            self._devices[device_id] = revoked
            self._save()
        return revoked

    def devices(self) -> list[Device]:
        return sorted(self._devices.values(), key=lambda d: d.id)

    def get(self, device_id: str) -> Device | None:
        return self._devices.get(device_id)

    def mqtt_password(self, device_id: str) -> str | None:
        """The device's MQTT password hash (``None`` for devices added before there was one)."""
        return self._mqtt.get(device_id)

    # -- requests --------------------------------------------------------------

    def authenticate(self, token: str | None) -> Device:
        """The device a bearer token belongs to.

        Raises:
            Unauthenticated: no token, an unknown or wrong one, or a revoked device.
        """
        if not token:
            raise Unauthenticated("missing bearer token (Authorization: Bearer <token>)")
        self.refresh()
        device_id, dot, _ = token.partition(".")
        expected = self._hashes.get(device_id) if dot else None
        if expected is None or not hmac.compare_digest(expected, _hash(token)):
            raise Unauthenticated("invalid token")
        device = self._devices[device_id]
        if device.revoked:
            raise Unauthenticated(f"device {device_id!r} is revoked")
        return device


@dataclass
class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up. Pure: time is passed in."""

    rate: float
    burst: float
    tokens: float
    updated: float

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class RateLimiter:
    """One token bucket per device."""

    def __init__(
        self, rate: float, burst: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = float(max(burst, 1)) if rate > 0 else 0.0
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}

    def check(self, device_id: str) -> None:
        """Spend one request of the device's allowance.

        Raises:
            RateLimited: the allowance is spent.
        """
        if self.rate <= 0:
            return
        now = self._clock()
        bucket = self._buckets.get(device_id)
        if bucket is None:
            bucket = self._buckets[device_id] = TokenBucket(self.rate, self.burst, self.burst, now)
        if not bucket.take(now):
            raise RateLimited(
                f"rate limit of {self.rate:g} requests/s exceeded for device {device_id!r}"
            )
