"""Commands that write the service's state run as the service's account.

The service runs as an account of its own (``edge-agent service install --user
edge-agent``), which owns the state directory (``state_dir``,
``/var/lib/edge-agent``: systemd's ``StateDirectory=`` gives it to the unit's
user). Run by root, a command that writes there (``edge-agent update``,
``models rollback``, ``run``) would leave files only root can read (the trusted
metadata is mode 0600), and every later check of the service would fail on them.

So such a command, run as root, first becomes the owner of the state directory
(:func:`run_as_state_owner`): that account's groups, its group, then its user id,
for good (real, effective and saved ids), before it opens any file of the state,
and says so on stderr. It drops rather than refuses because the directory's owner
*is* the service's account (nothing to guess or configure), what it writes is then
the service's by construction, and the command the gateway tells operators to run
(``cloud-gateway rollout start``) works as typed, with ``sudo`` or without.

Root stays root when root owns the directory (a service installed with ``--user
root``, for power modes), and before the directory exists (the nearest folder above
it decides; systemd gives a directory root made to the unit's user, all of it, at
the service's next start). A state that already holds a file the owner does not own
(left by an older version run as root) is refused with the command that gives it
back: the service cannot use it either.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from edge_agent.cli.common import PROG, CliError

__all__ = ["run_as_state_owner"]

MAX_ENTRIES = 10_000  # files looked at for one not the owner's (a state holds a few dozen)


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _foreign(folder: Path, uid: int) -> Path | None:
    """The first file or folder under ``folder`` that ``uid`` does not own (never
    following a link), looking at up to :data:`MAX_ENTRIES`."""
    seen = 0
    for top, folders, files in os.walk(folder):
        for name in [*folders, *files]:
            path = Path(top) / name
            seen += 1
            if os.lstat(path).st_uid != uid:
                return path
            if seen >= MAX_ENTRIES:
                return None
    return None


def _account(uid: int, gid: int) -> tuple[str, int, list[int]]:
    """The name, group and groups of ``uid`` (``gid`` and no others without a
    ``passwd`` entry, as for a dynamic user)."""
    import pwd

    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return str(uid), gid, [gid]
    return entry.pw_name, entry.pw_gid, os.getgrouplist(entry.pw_name, entry.pw_gid)


def run_as_state_owner(state_dir: Path, command: str) -> str | None:
    """Run as root, become the owner of ``state_dir`` (see the module docstring); the
    account this process now runs as, or ``None`` when it did not change.

    Raises:
        CliError: the state holds a file its owner does not own, or the owner cannot
            reach the state directory.
    """
    if os.geteuid() != 0:
        return None
    folder = _nearest_existing(state_dir)
    found = folder.stat()
    if found.st_uid == 0:
        return None
    name, gid, groups = _account(found.st_uid, found.st_gid)
    if folder == state_dir.absolute():
        foreign = _foreign(folder, found.st_uid)
        if foreign is not None:
            raise CliError(
                f"{foreign} is not owned by {name}, who owns {folder} and runs the service: "
                f"it cannot use it. Give the state back first (chown -R {name}: {folder}), "
                f"then run the command again"
            )
    os.setgroups(groups)
    os.setgid(gid)
    os.setuid(found.st_uid)
    if not os.access(folder, os.R_OK | os.W_OK | os.X_OK):
        raise CliError(
            f"{folder} belongs to {name}, who cannot reach it (a folder above it is closed "
            f"to that account): run the command as the service runs it"
        )
    print(
        f"{PROG}: {command} runs as {name} (uid {found.st_uid}), who owns {folder} and runs "
        "the service, not as root: what it writes there stays the service's",
        file=sys.stderr,
    )
    return name
