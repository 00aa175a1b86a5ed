"""Devices whose update checks fail: one row each, as long as they fail.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    op.create_table(
        "update_checks",
        sa.Column("device", sa.String(64), primary_key=True),
        sa.Column("grp", sa.String(64), nullable=False),
        sa.Column("failures", sa.Integer, nullable=False),
        sa.Column("detail", sa.Text, nullable=False, server_default=""),
        sa.Column("since", sa.Double, nullable=False),
        sa.Column("at", sa.Double, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("update_checks")
