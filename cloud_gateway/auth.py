"""Device authentication: per-device bearer tokens, stored hashed, and rate limits.

A token is ``<device id>.<32 random bytes, base64url>``. The registry keeps
only the SHA-256 of each token: the tokens are 256-bit random values, so a fast hash is as strong
as a slow one here and lets every request be checked in microseconds. The
token is printed once, when the device is added, and never stored.

Each device also gets a Mosquitto-compatible hash of its token (its MQTT
password; see ``cloud-gateway mqtt acl``), made while the token is known.

The devices live in the state database (:mod:`cloud_gateway.state`), which
every replica and the command line share; the gateway reads them again when
they change (checked at most once a second), so ``cloud-gateway device add``
and ``device revoke`` take effect on every running replica within a second.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import sqlalchemy as sa

from cloud_gateway.state import schema
from cloud_gateway.state.database import StateDatabase, describe
from edge_core.errors import ConfigError, RateLimited, Unauthenticated, Unavailable

__all__ = [
    "Device",
    "DeviceRegistry",
    "RateLimiter",
    "TokenBucket",
    "mosquitto_hash",
    "parse_bearer",
    "write_private",
]

log = logging.getLogger(__name__)

DEVICE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
ROLES = ("device", "admin", "metrics")  # metrics: reads /metrics, nothing else (a scraper)


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
    """The devices allowed to call the gateway, in the state database.

    Requests are checked against a copy in memory (a dict lookup and a hash);
    the copy is read again when the database's change serial moved, which is
    looked at most once a second (:meth:`refresh`), or every ``interval`` by
    :meth:`watch` in a thread of its own (the gateway's: no request waits on the
    database). So a revocation made anywhere, by any replica's command line, is
    refused by every replica within a second.
    """

    def __init__(
        self,
        database: StateDatabase,
        *,
        clock: Callable[[], float] = time.monotonic,
        load: bool = True,
    ) -> None:
        """``load``: read the devices now (else at the first :meth:`refresh`).

        Raises: ConfigError (the database cannot be read)."""
        self.database = database
        self.path = describe(database.url)  # where it lives, for messages
        self._clock = clock
        self._lock = threading.Lock()
        self._devices: dict[str, Device] = {}
        self._hashes: dict[str, str] = {}
        self._mqtt: dict[str, str] = {}
        self._serial: int | None = None
        self._checked = float("-inf")
        self._looked_up = float("-inf")  # the last refresh for an unknown id
        self._watching = False
        if load:
            self._load()

    @property
    def loaded(self) -> bool:
        """Whether the devices have been read (at least once)."""
        return self._serial is not None

    # -- database -------------------------------------------------------------

    def _read_serial(self, connection: sa.Connection) -> int:
        return int(connection.execute(sa.select(schema.serial.c.value)).scalar_one())

    def _load(self) -> None:
        devices: dict[str, Device] = {}
        hashes: dict[str, str] = {}
        mqtt: dict[str, str] = {}
        try:
            with self.database.begin() as connection:
                serial = self._read_serial(connection)
                for row in connection.execute(sa.select(schema.devices)):
                    devices[row.id] = Device(
                        row.id, row.grp, row.role, bool(row.revoked), row.created
                    )
                    hashes[row.id] = row.token_sha256
                    if row.mqtt_password:
                        mqtt[row.id] = row.mqtt_password
        except (sa.exc.SQLAlchemyError, Unavailable) as exc:
            raise ConfigError(f"the device registry is unreadable: {exc}", path=None) from exc
        self._devices, self._hashes, self._mqtt, self._serial = devices, hashes, mqtt, serial

    def refresh(self, *, force: bool = False) -> bool:
        """Read the devices again if they changed (at most once a second unless
        ``force``); whether they had. A database that cannot be reached keeps the
        last copy (logged)."""
        now = self._clock()
        if not force and (self._watching or now - self._checked < 1.0):
            return False
        self._checked = now
        try:
            with self.database.begin() as connection:
                changed = self._read_serial(connection) != self._serial
            if changed:
                with self._lock:
                    self._load()
        except (sa.exc.SQLAlchemyError, ConfigError, Unavailable) as exc:
            log.warning("the device registry could not be read (the last copy serves): %s", exc)
            return False
        return changed

    def watch(self, stop: threading.Event, interval: float = 0.5) -> None:
        """Refresh every ``interval`` until ``stop`` is set (run it in a thread); requests
        then never read the database themselves."""
        self._watching = True
        try:
            while not stop.wait(interval):
                self.refresh(force=True)
        finally:
            self._watching = False

    def _bump(self, connection: sa.Connection) -> None:
        connection.execute(schema.serial.update().values(value=schema.serial.c.value + 1))

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
        token = f"{device_id}.{secrets.token_urlsafe(32)}"
        row = {
            "id": device_id,
            "grp": group,
            "role": role,
            "revoked": False,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "token_sha256": _hash(token),
            "mqtt_password": mosquitto_hash(token),
        }
        table = schema.devices
        try:
            with self.database.begin() as connection:
                # the key decides: of two `device add` of one id, one fails
                if replace:
                    done = connection.execute(
                        table.update().where(table.c.id == device_id).values(row)
                    ).rowcount
                    if not done:
                        connection.execute(table.insert().values(row))
                else:
                    connection.execute(table.insert().values(row))
                self._bump(connection)
        except sa.exc.IntegrityError:
            raise ValueError(
                f"device {device_id!r} already exists (use --replace for a new token)"
            ) from None
        self.refresh(force=True)
        return token

    def revoke(self, device_id: str) -> Device:
        """Revoke a device's token.

        Raises:
            KeyError: no such device.
        """
        table = schema.devices
        with self.database.begin() as connection:
            done = connection.execute(
                table.update().where(table.c.id == device_id).values(revoked=True)
            ).rowcount
            if not done:
                raise KeyError(f"no device {device_id!r} in {self.path}")
            self._bump(connection)
        self.refresh(force=True)
        return self._devices[device_id]

    @classmethod
    def add_to(cls, url: str, device_id: str, group: str, *, role: str = "device") -> str:
        """Register a device in the state database at ``url`` (opened and closed here);
        its token. Raises: as :meth:`add`, and ConfigError (the database)."""
        from cloud_gateway.state import open_state

        database = open_state(url)
        try:
            return cls(database).add(device_id, group, role=role)
        finally:
            database.close()

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
        now = self._clock()
        if dot and device_id not in self._hashes and now - self._looked_up >= 0.1:
            # a device added a moment ago: looked for now, not at the next check (at
            # most ten times a second, whatever unknown ids clients send; counted apart
            # from the periodic checks, or one a moment before the device was added
            # would refuse it)
            self._looked_up = now
            self.refresh(force=True)
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
    """One token bucket per device (``what`` it counts, for the refusal's message)."""

    def __init__(
        self,
        rate: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        what: str = "requests",
    ) -> None:
        self.rate = rate
        self.what = what
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
                f"rate limit of {self.rate:g} {self.what}/s exceeded for device {device_id!r} "
                f"(bursts of up to {self.burst:g})"
            )
