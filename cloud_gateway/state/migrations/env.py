"""Alembic's environment: migrations run on the connection the caller hands over
(:func:`cloud_gateway.state.database.upgrade`), never on one made from a file."""

from __future__ import annotations

from alembic import context

connection = context.config.attributes["connection"]
# batch mode: SQLite changes a table by copying it
context.configure(connection=connection, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
