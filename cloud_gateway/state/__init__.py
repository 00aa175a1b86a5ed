"""The gateway's shared state: devices, rollouts, reports, in one database that every
replica and the command line open by one URL (SQLite embedded, or PostgreSQL)."""

from cloud_gateway.state.database import StateDatabase, describe, open_state, upgrade

__all__ = ["StateDatabase", "describe", "open_state", "upgrade"]
