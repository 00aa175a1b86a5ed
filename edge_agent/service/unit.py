"""Render and install the ``edge-agent.service`` unit.

The workflow of ``edge-agent service install``: :func:`render_unit` fills the
template shipped beside this module (``edge-agent.service``, read through
:mod:`importlib.resources` so it works from a wheel) with the interpreter,
the configuration file and the account; :func:`install_unit` writes the result
into systemd's unit directory, mode 0644, atomically (a half-written unit
would be read by the next ``daemon-reload``). Rendering checks what would only
fail later, at ``systemctl start``, with an exit status instead of a reason:
relative paths, paths the sandbox hides (``ProtectHome=``, ``PrivateTmp=``),
characters a unit file cannot hold, malformed account names. Nothing here
talks to systemd.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Sequence
from importlib import resources
from pathlib import Path, PurePosixPath

from edge_core.errors import EdgeError

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_GROUPS",
    "DEFAULT_UNIT_DIR",
    "HIDDEN_DIRS",
    "UNIT_NAME",
    "UnitError",
    "install_unit",
    "render_unit",
]

UNIT_NAME = "edge-agent.service"
DEFAULT_UNIT_DIR = Path("/etc/systemd/system")
DEFAULT_CONFIG = Path("/etc/edge-agent/agent.toml")
# The groups that own accelerator device nodes on the supported boards (see the template).
DEFAULT_GROUPS = ("video", "render")

# Directories the unit's sandbox hides from the service: ProtectHome=yes, PrivateTmp=yes.
HIDDEN_DIRS = ("/home", "/root", "/run/user", "/tmp", "/var/tmp")

# What systemd accepts in User= and SupplementaryGroups= (its "relaxed" rules, minus the
# characters that would need quoting), or a numeric id.
_ACCOUNT = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}|[0-9]+")
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_NEEDS_QUOTES = re.compile(r"[\s\"'\\;]")


class UnitError(EdgeError):
    """The unit cannot be rendered (a bad path or name) or installed (the directory)."""


def _group_exists(name: str) -> bool:
    import grp

    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def render_unit(
    python: str,
    config: Path,
    user: str | None,
    *,
    groups: Sequence[str] = (),
    warnings: list[str] | None = None,
) -> str:
    """The text of ``edge-agent.service``.

    ``python`` is the interpreter the service runs (a virtual environment's
    ``bin/python`` as it is, not resolved: the link is what selects the
    environment); ``config`` the agent configuration it loads; ``user`` an
    existing account, or ``None`` for ``DynamicUser=yes``; ``groups`` are
    supplementary groups besides those of :data:`DEFAULT_GROUPS` that exist on
    this host (a missing group would stop the service from starting; ``render``
    is not on every board), e.g. ``apex`` for an Edge TPU. Every account but
    root also loses all capabilities (``CapabilityBoundingSet=``); root keeps
    them for power modes.

    With a ``warnings`` list (a dry run), a path the sandbox would hide is said
    there instead of refused, and the unit rendered all the same.

    Raises:
        UnitError: a path is relative, lies where the sandbox hides it (unless
            ``warnings`` is given), or holds characters systemd refuses there; an
            account name is malformed.
    """
    if user is None:
        identity = "DynamicUser=yes\nCapabilityBoundingSet="
    elif _account(user, "user") in ("root", "0"):
        identity = f"User={user}"
    else:
        identity = f"User={user}\nCapabilityBoundingSet="
    present = [group for group in DEFAULT_GROUPS if _group_exists(group)]
    all_groups = list(dict.fromkeys([*present, *groups]))
    values = {
        "python": _exec_word(_executable(python, warnings), executable=True),
        "config": _exec_word(_visible_path(str(config), "the configuration (--config)", warnings)),
        "identity": identity,
        "groups": " ".join(_account(group, "group") for group in all_groups),
    }
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], _template())


def install_unit(text: str, unit_dir: Path, dry_run: bool) -> Path:
    """Write ``text`` as ``unit_dir/edge-agent.service`` (mode 0644) and return its path.

    The file is replaced atomically, so systemd never reads half a unit. With
    ``dry_run`` nothing is written; the path is returned all the same.

    Raises:
        UnitError: ``unit_dir`` is not a directory, or the file cannot be
            written there (permissions: systemd's directories are root's).
    """
    target = unit_dir / UNIT_NAME
    if not unit_dir.is_dir():
        raise UnitError(
            f"unit directory {unit_dir} does not exist; expected systemd's unit directory "
            f"({DEFAULT_UNIT_DIR}) or an existing directory given with --unit-dir"
        )
    if dry_run:
        return target
    tmp_name: str | None = None
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{UNIT_NAME}.", dir=unit_dir)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            # mkstemp makes 0600 and the umask must not matter: systemd and
            # `systemctl cat` read units as any user.
            os.fchmod(handle.fileno(), 0o644)
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
        tmp_name = None
    except PermissionError as exc:
        raise UnitError(
            f"cannot write {target}: permission denied; run the install as root "
            f"(sudo) or give a directory you can write with --unit-dir"
        ) from exc
    except OSError as exc:
        raise UnitError(f"cannot write {target}: {exc.strerror or exc}") from exc
    finally:
        if tmp_name is not None:
            Path(tmp_name).unlink(missing_ok=True)
    return target


def _template() -> str:
    return resources.files("edge_agent.service").joinpath(UNIT_NAME).read_text(encoding="utf-8")


def _account(name: str, what: str) -> str:
    if not _ACCOUNT.fullmatch(name):
        raise UnitError(
            f"{what} name {name!r} is not valid in a unit; expected letters, digits, '_', '.' "
            f"and '-', starting with a letter or '_' (at most 32), or a numeric id"
        )
    return name


def _visible_path(value: str, what: str, warnings: list[str] | None = None) -> str:
    """``value`` if the service will see it: absolute, printable, not in a hidden directory
    (with ``warnings``: a hidden one is said there)."""
    if any(ord(char) < 32 or ord(char) == 127 for char in value):
        raise UnitError(f"{what} {value!r} holds control characters; expected a plain path")
    path = PurePosixPath(os.path.normpath(value))
    if not path.is_absolute():
        raise UnitError(
            f"{what} {value!r} is relative; expected an absolute path (the service "
            f"starts in /, not here)"
        )
    for hidden in HIDDEN_DIRS:
        if path.is_relative_to(hidden):
            message = (
                f"{what} {value} is under {hidden}, which the service's sandbox hides "
                f"(ProtectHome=yes, PrivateTmp=yes); expected a path outside "
                f"{', '.join(HIDDEN_DIRS)}, such as /opt/edge-agent or /etc/edge-agent "
                "(docs/install.md)"
            )
            if warnings is None:
                raise UnitError(message)
            warnings.append(message)
    return value


def _executable(value: str, warnings: list[str] | None = None) -> str:
    what = "the Python interpreter (--python)"
    _visible_path(value, what, warnings)
    if any(char in value for char in "\"'\\"):
        # systemd refuses such an executable name outright, quoted or not.
        raise UnitError(f"{what} {value!r} holds quotes or backslashes, which systemd refuses")
    if value.endswith("/"):
        raise UnitError(f"{what} {value!r} ends in '/'; expected the interpreter's file")
    return value


def _exec_word(value: str, *, executable: bool = False) -> str:
    """``value`` as one word of an ``ExecStart=`` line.

    systemd expands ``%`` specifiers in every word and ``$`` variables in the
    arguments (not in the executable's name), so those are doubled; a word
    with blanks, quotes, backslashes or ``;`` (a command separator) is
    double-quoted with C escapes.
    """
    escaped = value.replace("%", "%%")
    if not executable:
        escaped = escaped.replace("$", "$$")
    if not _NEEDS_QUOTES.search(escaped):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'
