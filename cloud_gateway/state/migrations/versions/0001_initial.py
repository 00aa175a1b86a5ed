"""The first schema: devices, the change serial, rollouts, reports, seen, serving.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "devices",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("grp", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("revoked", sa.Boolean, nullable=False),
        sa.Column("created", sa.String(40), nullable=False),
        sa.Column("token_sha256", sa.String(64), nullable=False),
        sa.Column("mqtt_password", sa.Text, nullable=True),
    )
    serial = op.create_table(
        "state_serial",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("value", sa.BigInteger, nullable=False),
    )
    op.bulk_insert(serial, [{"id": 1, "value": 0}])
    op.create_table(
        "rollouts",
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
    op.create_table(
        "reports",
        sa.Column("device", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("version", sa.Integer, primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("detail", sa.Text, nullable=False, server_default=""),
        sa.Column("at", sa.Double, nullable=False),
        sa.Column("grp", sa.String(64), nullable=False, server_default=""),
    )
    op.create_index("reports_by_rollout", "reports", ["name", "version", "grp"])
    op.create_table(
        "seen",
        sa.Column("device", sa.String(64), primary_key=True),
        sa.Column("at", sa.Double, nullable=False),
        sa.Column("what", sa.String(32), nullable=False, server_default=""),
    )
    op.create_table(
        "serving",
        sa.Column("device", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("at", sa.Double, nullable=False),
    )


def downgrade() -> None:
    for table in ("serving", "seen", "reports", "rollouts", "state_serial", "devices"):
        op.drop_table(table)
