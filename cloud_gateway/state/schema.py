"""The tables of the gateway's state (SQLAlchemy Core), shared by every replica.

The migrations (``migrations/versions``) create and change them; this module
is what the code reads and writes, and must say the same as the latest one.
Times are seconds since the epoch in double precision (PostgreSQL's ``REAL``
would keep them to two minutes).
"""

from __future__ import annotations

import sqlalchemy as sa

__all__ = [
    "METADATA",
    "actions",
    "device_history",
    "device_status",
    "devices",
    "reports",
    "rollouts",
    "seen",
    "serial",
    "serving",
    "sessions",
    "update_checks",
]

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
    # what an `installed` report's smoke test ran and measured (0002)
    sa.Column("variant", sa.String(64), nullable=False, server_default=""),
    sa.Column("latency_ms", sa.Double, nullable=True),
    sa.Index("reports_by_rollout", "name", "version", "grp"),
)

# Devices whose update checks fail, as they say (0003): one row each while they fail
# (the device tells the gateway when they start and when one succeeds again).
update_checks = sa.Table(
    "update_checks",
    METADATA,
    sa.Column("device", sa.String(64), primary_key=True),
    sa.Column("grp", sa.String(64), nullable=False),
    sa.Column("failures", sa.Integer, nullable=False),  # checks in a row, as the device counts
    sa.Column("detail", sa.Text, nullable=False, server_default=""),  # why the last one failed
    sa.Column("since", sa.Double, nullable=False),  # the gateway's clock, when first told
    sa.Column("at", sa.Double, nullable=False),  # when last told
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

# The latest telemetry of each device (0002): what the dashboard's Fleet and Device
# pages show. JSON columns are text (one type for both databases); every value comes
# from the device, bounded and checked (cloud_gateway/fleet/telemetry.py), and is shown
# escaped.
device_status = sa.Table(
    "device_status",
    METADATA,
    sa.Column("device", sa.String(64), primary_key=True),
    sa.Column("at", sa.Double, nullable=False),  # the gateway's clock, when it arrived
    sa.Column("source", sa.String(8), nullable=False, server_default=""),  # mqtt | http
    sa.Column("seq", sa.BigInteger, nullable=True),
    sa.Column("interval_s", sa.Double, nullable=True),  # how often the device reports
    sa.Column("profile", sa.String(200), nullable=True),
    sa.Column("power_mode", sa.String(64), nullable=True),
    sa.Column("models", sa.Text, nullable=True),  # {name: {version, variant}}
    sa.Column("temperatures", sa.Text, nullable=True),  # {zone: degrees C}
    sa.Column("hottest", sa.Double, nullable=True),
    sa.Column("throttled", sa.Boolean, nullable=True),
    sa.Column("critical", sa.Boolean, nullable=True),
    sa.Column("cpu_load", sa.Double, nullable=True),
    sa.Column("breaker", sa.String(16), nullable=True),
    sa.Column("guard_refusals", sa.Integer, nullable=True),
    # {bytes_sent, bytes_received, rtt_ms, bandwidth_mbit_s} of the offload link (0004)
    sa.Column("link", sa.Text, nullable=True),
    sa.Column("queue_waiting", sa.Integer, nullable=True),
    sa.Column("queue_dropped", sa.Integer, nullable=True),
    sa.Column("decisions", sa.Text, nullable=True),  # {action: count since the agent started}
    sa.Column("degraded", sa.Integer, nullable=True),  # degraded answers since it started
    sa.Column("degraded_at", sa.Double, nullable=False, server_default="0"),  # last rise
    sa.Column("latency", sa.Text, nullable=True),  # {answerer: {p50_ms, p95_ms, p99_ms}}
    sa.Column("online", sa.String(8), nullable=False, server_default=""),  # its status topic
    sa.Column("online_at", sa.Double, nullable=False, server_default="0"),
)

# One point a minute per device, kept for ``[dashboard] history_hours`` (0002).
device_history = sa.Table(
    "device_history",
    METADATA,
    sa.Column("device", sa.String(64), primary_key=True),
    sa.Column("minute", sa.BigInteger, primary_key=True),  # seconds since the epoch // 60
    sa.Column("hottest", sa.Double, nullable=True),
    sa.Column("cpu_load", sa.Double, nullable=True),
    sa.Column("local_ms", sa.Double, nullable=True),  # p50 answered on the device
    sa.Column("offload_ms", sa.Double, nullable=True),  # p50 answered by the cloud
    sa.Column("decisions", sa.Text, nullable=True),  # {action: count since it started}
    sa.Column("degraded", sa.Integer, nullable=True),
    sa.Column("queue_waiting", sa.Integer, nullable=True),
    sa.Index("device_history_by_minute", "minute"),
)

# The operators' actions on the dashboard (and its API), who did them and when (0002).
actions = sa.Table(
    "actions",
    METADATA,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("at", sa.Double, nullable=False),
    sa.Column("actor", sa.String(64), nullable=False),
    sa.Column("action", sa.String(32), nullable=False),
    sa.Column("target", sa.String(300), nullable=False),
    sa.Column("detail", sa.Text, nullable=False, server_default=""),
)

# Dashboard sign-ins (0002): the SHA-256 of each session's cookie, never the cookie.
sessions = sa.Table(
    "sessions",
    METADATA,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("actor", sa.String(64), nullable=False),
    sa.Column("csrf", sa.String(64), nullable=False),
    sa.Column("created", sa.Double, nullable=False),
    sa.Column("used", sa.Double, nullable=False),
    sa.Index("sessions_by_actor", "actor"),
)
