"""The tables of the gateway's state (SQLAlchemy Core), shared by every replica.

The migrations (``migrations/versions``) create and change them; this module
is what the code reads and writes, and must say the same as the latest one.
Times are seconds since the epoch in double precision (PostgreSQL's ``REAL``
would keep them to two minutes).
"""

from __future__ import annotations

import sqlalchemy as sa

__all__ = ["METADATA", "devices", "reports", "rollouts", "seen", "serial", "serving"]

METADATA = sa.MetaData()

# Devices and their token hashes (SHA-256; the token itself is never stored), their
# group and role, and whether they are revoked.
devices = sa.Table(
    "devices",
    METADATA,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("grp", sa.String(64), nullable=False),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("revoked", sa.Boolean, nullable=False),
    sa.Column("created", sa.String(40), nullable=False),
    sa.Column("token_sha256", sa.String(64), nullable=False),
    sa.Column("mqtt_password", sa.Text, nullable=True),
)

# One row: raised in the same transaction as every change of ``devices``, so that a
# replica learns of a change (a revocation) by reading one number.
serial = sa.Table(
    "state_serial",
    METADATA,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("value", sa.BigInteger, nullable=False),
)

rollouts = sa.Table(
    "rollouts",
    METADATA,
    sa.Column("name", sa.String(200), primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("grp", sa.String(64), primary_key=True),
    sa.Column("percent", sa.Double, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("failure_threshold", sa.Double, nullable=False),
    sa.Column("reason", sa.Text, nullable=False, server_default=""),
    sa.Column("created", sa.Double, nullable=False),
    sa.Column("updated", sa.Double, nullable=False),
    sa.Column("started", sa.Double, nullable=False, server_default="0"),
)

reports = sa.Table(
    "reports",
    METADATA,
    sa.Column("device", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(200), primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("detail", sa.Text, nullable=False, server_default=""),
    sa.Column("at", sa.Double, nullable=False),
    sa.Column("grp", sa.String(64), nullable=False, server_default=""),
    sa.Index("reports_by_rollout", "name", "version", "grp"),
)

# When each device was last heard from, and how (an update check, a request).
seen = sa.Table(
    "seen",
    METADATA,
    sa.Column("device", sa.String(64), primary_key=True),
    sa.Column("at", sa.Double, nullable=False),
    sa.Column("what", sa.String(32), nullable=False, server_default=""),
)

# What each device says it serves, by model (from its reports).
serving = sa.Table(
    "serving",
    METADATA,
    sa.Column("device", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(200), primary_key=True),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("at", sa.Double, nullable=False),
)
