"""The dashboard: each device's latest telemetry and its history, the operators'
actions, sign-in sessions, and what an installed report's smoke test measured.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


# one body, long: a migration is history, kept as it ran on every database since
def upgrade() -> None:
    with op.batch_alter_table("reports") as batch:
        batch.add_column(sa.Column("variant", sa.String(64), nullable=False, server_default=""))
        batch.add_column(sa.Column("latency_ms", sa.Double, nullable=True))
    op.create_table(
        "device_status",
        sa.Column("device", sa.String(64), primary_key=True),
        sa.Column("at", sa.Double, nullable=False),
        sa.Column("source", sa.String(8), nullable=False, server_default=""),
        sa.Column("seq", sa.BigInteger, nullable=True),
        sa.Column("interval_s", sa.Double, nullable=True),
        sa.Column("profile", sa.String(200), nullable=True),
        sa.Column("power_mode", sa.String(64), nullable=True),
        sa.Column("models", sa.Text, nullable=True),
        sa.Column("temperatures", sa.Text, nullable=True),
        sa.Column("hottest", sa.Double, nullable=True),
        sa.Column("throttled", sa.Boolean, nullable=True),
        sa.Column("critical", sa.Boolean, nullable=True),
        sa.Column("cpu_load", sa.Double, nullable=True),
        sa.Column("breaker", sa.String(16), nullable=True),
        sa.Column("guard_refusals", sa.Integer, nullable=True),
        sa.Column("queue_waiting", sa.Integer, nullable=True),
        sa.Column("queue_dropped", sa.Integer, nullable=True),
        sa.Column("decisions", sa.Text, nullable=True),
        sa.Column("degraded", sa.Integer, nullable=True),
        sa.Column("degraded_at", sa.Double, nullable=False, server_default="0"),
        sa.Column("latency", sa.Text, nullable=True),
        sa.Column("online", sa.String(8), nullable=False, server_default=""),
        sa.Column("online_at", sa.Double, nullable=False, server_default="0"),
    )
    op.create_table(
        "device_history",
        sa.Column("device", sa.String(64), primary_key=True),
        sa.Column("minute", sa.BigInteger, primary_key=True),
        sa.Column("hottest", sa.Double, nullable=True),
        sa.Column("cpu_load", sa.Double, nullable=True),
        sa.Column("local_ms", sa.Double, nullable=True),
        sa.Column("offload_ms", sa.Double, nullable=True),
        sa.Column("decisions", sa.Text, nullable=True),
        sa.Column("degraded", sa.Integer, nullable=True),
        sa.Column("queue_waiting", sa.Integer, nullable=True),
    )
    op.create_index("device_history_by_minute", "device_history", ["minute"])
    op.create_table(
        "actions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.Double, nullable=False),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("target", sa.String(300), nullable=False),
        sa.Column("detail", sa.Text, nullable=False, server_default=""),
    )
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("csrf", sa.String(64), nullable=False),
        sa.Column("created", sa.Double, nullable=False),
        sa.Column("used", sa.Double, nullable=False),
    )
    op.create_index("sessions_by_actor", "sessions", ["actor"])


def downgrade() -> None:
    for table in ("sessions", "actions", "device_history", "device_status"):
        op.drop_table(table)
    with op.batch_alter_table("reports") as batch:
        batch.drop_column("latency_ms")
        batch.drop_column("variant")
