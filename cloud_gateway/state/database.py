"""The state database: one URL, SQLite embedded or a PostgreSQL that replicas share.

``state = "sqlite:///gateway-state/gateway.sqlite"`` (the default: a file in
the state directory, nothing to install) or
``state = "postgresql://user:password@host/db"`` (psycopg 3). Every replica
and every command line opens the same URL. Opening it (:func:`open_state`)
first brings its schema up to date (:func:`upgrade`, Alembic's migrations,
also ``cloud-gateway db upgrade``), under a lock that makes replicas started
together take turns (PostgreSQL: an advisory lock; SQLite: a lock file), and
imports the state of a gateway from before the database (``devices.json``,
``rollouts.sqlite``; :mod:`cloud_gateway.state.legacy`) once.

SQLite runs in WAL mode with a 30 s busy timeout, so the gateway and the
command line write to it together. PostgreSQL connections are checked before
use (a replica outlives a database restart) and give up connecting after
``connect_timeout``. Every statement is counted (:attr:`StateDatabase.queries`),
for the fleet benchmark's queries per device check.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from edge_core.errors import ConfigError, Unavailable

__all__ = ["StateDatabase", "describe", "open_state", "upgrade"]

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
_LOCK_KEY = 0x6564_6765  # "edge": the advisory lock of the migrations
SCHEMES = ("sqlite", "postgresql")


def describe(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "<not a database URL>"


def _engine(url: str) -> sa.Engine:
    """Raises: ConfigError (not a URL this gateway can use)."""
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError:
        raise ConfigError(f"state: not a database URL: {url!r}", field="state") from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise ConfigError("state: a SQLite database must be a file", field="state")
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(
            parsed.set(drivername="sqlite"),
            connect_args={"timeout": 30.0, "check_same_thread": False},
        )

        @sa.event.listens_for(engine, "connect")
        def _pragmas(connection: Any, record: Any) -> None:
            cursor = connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        return engine
    if backend == "postgresql":
        query = dict(parsed.query)
        query.setdefault("connect_timeout", "5")
        return sa.create_engine(
            parsed.set(drivername="postgresql+psycopg", query=query),
            pool_pre_ping=True,
            pool_size=5,
            max_overflow=10,
        )
    raise ConfigError(
        f"state: {backend!r} databases are not supported; expected sqlite:/// or postgresql://",
        field="state",
    )


class StateDatabase:
    """An engine on the state URL, and a count of the statements it ran."""

    def __init__(self, url: str) -> None:
        """Raises: ConfigError (a URL this gateway cannot use)."""
        self.url = url
        self.engine = _engine(url)
        self.dialect = self.engine.dialect.name
        self.queries = 0
        self._count_lock = threading.Lock()

        @sa.event.listens_for(self.engine, "before_cursor_execute")
        def _count(*args: Any) -> None:
            with self._count_lock:
                self.queries += 1

    def __repr__(self) -> str:
        return f"StateDatabase({describe(self.url)!r})"

    @contextlib.contextmanager
    def begin(self) -> Iterator[sa.Connection]:
        """A connection in a transaction, committed when the block ends without error.

        Raises:
            Unavailable: the database cannot be reached, or stayed locked (a 503 for a
                request; the statement's own errors pass as they are).
        """
        try:
            with self.engine.begin() as connection:
                yield connection
        except sa.exc.OperationalError as exc:
            raise Unavailable(
                f"the state database {describe(self.url)} is unavailable: "
                f"{str(exc.orig).strip().splitlines()[0][:200]}"
            ) from exc

    def close(self) -> None:
        self.engine.dispose()


@contextlib.contextmanager
def _migration_lock(database: StateDatabase, connection: sa.Connection) -> Iterator[None]:
    if database.dialect == "postgresql":
        connection.execute(sa.text("SELECT pg_advisory_lock(:key)"), {"key": _LOCK_KEY})
        connection.commit()
        try:
            yield
        finally:
            connection.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": _LOCK_KEY})
            connection.commit()
        return
    path = sa.make_url(database.url).database
    with open(f"{path}.migrating", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def current_revision(database: StateDatabase) -> str | None:
    """The schema's Alembic revision (``None``: an empty database)."""
    from alembic.runtime.migration import MigrationContext

    with database.engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def upgrade(database: StateDatabase, *, legacy_dir: Path | None = None) -> str:
    """Bring the schema to the newest revision (Alembic), then import the files of a
    gateway from before the database found in ``legacy_dir``; returns the revision.

    Raises:
        ConfigError: the database cannot be reached or refuses the migration.
    """
    from alembic import command
    from alembic.config import Config

    from cloud_gateway.state.legacy import import_legacy

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    try:
        before = current_revision(database)
        with database.engine.connect() as connection, _migration_lock(database, connection):
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
            connection.commit()
        if legacy_dir is not None:
            import_legacy(database, Path(legacy_dir))
        revision = current_revision(database)
        if revision != before:
            log.info(
                "state database %s: schema %s (was %s)",
                describe(database.url),
                revision,
                before or "empty",
            )
    except (sa.exc.SQLAlchemyError, Unavailable) as exc:
        raise ConfigError(
            f"the state database {describe(database.url)}: {exc.__class__.__name__}: "
            f"{str(getattr(exc, 'orig', None) or exc).strip()[:300]}",
            field="state",
        ) from exc
    return revision or ""


def open_state(url: str, *, legacy_dir: Path | None = None) -> StateDatabase:
    """The state database at ``url``, its schema up to date (see :func:`upgrade`).

    Raises:
        ConfigError: not a usable URL, or the database cannot be reached.
    """
    database = StateDatabase(url)
    try:
        upgrade(database, legacy_dir=legacy_dir)
    except BaseException:
        database.close()
        raise
    return database
