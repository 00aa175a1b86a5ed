"""What a device's offload link carried, and what the device makes of the link.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    with op.batch_alter_table("device_status") as table:
        table.add_column(sa.Column("link", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("device_status") as table:
        table.drop_column("link")
