"""Dashboard sign-ins: a session cookie for an admin token, kept in the state database.

Signing in takes an admin token (``cloud-gateway device add NAME --admin``); a device's
token is refused. The browser then holds only a random session id in a cookie
(``HttpOnly``, ``SameSite=Strict``, ``Secure`` when the gateway serves TLS); the
database keeps its SHA-256, never the id, with who signed in and the session's CSRF
token, which every action must carry back. Every replica reads the same table, so a
sign-in made through one is good on all, and signing out ends it on all.

Bounded: a session ends when unused for ``session_idle_s`` or, whatever, after
``session_max_s``; an admin holds at most :data:`PER_ACTOR` sessions and the gateway
``max_sessions`` (past either, the least recently used ends). A session ends at once
when its admin is revoked (the registry is read on every use).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa

from cloud_gateway.auth import DeviceRegistry
from cloud_gateway.config import DashboardSettings
from cloud_gateway.state import schema
from cloud_gateway.state.database import StateDatabase

__all__ = ["COOKIE", "PER_ACTOR", "Session", "Sessions"]

COOKIE = "edge_session"
PER_ACTOR = 10
TOUCH_S = 30.0  # a session's last use is written at most this often


def _hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@dataclass(frozen=True)
class Session:
    id: str  # the SHA-256 of the cookie
    actor: str  # the admin who signed in
    csrf: str

    def csrf_ok(self, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(self.csrf, str(token))


class Sessions:
    def __init__(
        self,
        database: StateDatabase,
        registry: DeviceRegistry,
        settings: DashboardSettings,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.database = database
        self.registry = registry
        self.settings = settings
        self._clock = clock

    def create(self, actor: str) -> tuple[str, Session]:
        """A new session for ``actor``: the cookie's value (shown once) and the session."""
        cookie = secrets.token_urlsafe(32)
        session = Session(_hash(cookie), actor, secrets.token_urlsafe(32))
        now = self._clock()
        table = schema.sessions
        with self.database.begin() as connection:
            self._expire(connection, now)
            for limit, where in (
                (PER_ACTOR - 1, table.c.actor == actor),
                (self.settings.max_sessions - 1, sa.true()),
            ):
                keep = sa.select(table.c.id).where(where).order_by(table.c.used.desc()).limit(limit)
                connection.execute(table.delete().where(where, table.c.id.not_in(keep)))
            connection.execute(
                table.insert().values(
                    id=session.id, actor=actor, csrf=session.csrf, created=now, used=now
                )
            )
        return cookie, session

    def _expire(self, connection: sa.Connection, now: float) -> None:
        table = schema.sessions
        connection.execute(
            table.delete().where(
                sa.or_(
                    table.c.used < now - self.settings.session_idle_s,
                    table.c.created < now - self.settings.session_max_s,
                )
            )
        )

    def lookup(self, cookie: str | None) -> Session | None:
        """The live session of a cookie (its last use noted), or ``None``."""
        if not cookie or len(cookie) > 128:
            return None
        table = schema.sessions
        now = self._clock()
        key = _hash(cookie)
        with self.database.begin() as connection:
            row = connection.execute(sa.select(table).where(table.c.id == key)).first()
            if row is None:
                return None
            alive = (
                now - row.used < self.settings.session_idle_s
                and now - row.created < self.settings.session_max_s
            )
            actor = self.registry.get(row.actor)
            if not alive or actor is None or actor.revoked or actor.role != "admin":
                connection.execute(table.delete().where(table.c.id == key))
                return None
            if now - row.used > TOUCH_S:
                connection.execute(table.update().where(table.c.id == key).values(used=now))
        return Session(key, row.actor, row.csrf)

    def end(self, session: Session) -> None:
        table = schema.sessions
        with self.database.begin() as connection:
            connection.execute(table.delete().where(table.c.id == session.id))

    def prune(self) -> None:
        with self.database.begin() as connection:
            self._expire(connection, self._clock())

    def count(self) -> int:
        with self.database.begin() as connection:
            return int(
                connection.execute(sa.select(sa.func.count()).select_from(schema.sessions)).scalar()
                or 0
            )
