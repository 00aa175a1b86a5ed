"""The one error when an optional library is missing: :func:`require` imports it, or
says which extra of ``edge-inference`` brings it (the agent's table of extras is
:mod:`edge_agent.extras`; the shared pictures code, :mod:`edge_core.imaging`, asks for
Pillow through it too)."""

from __future__ import annotations

import importlib
from types import ModuleType

from edge_core.errors import MissingExtraError

__all__ = ["require"]


def require(module: str, package: str, extra: str, purpose: str) -> ModuleType:
    """``module`` imported, for ``purpose``.

    Raises:
        MissingExtraError: it is not installed; the message names ``package`` and the
            extra that brings it (``""``: the base install, to be repaired).
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        where = (
            f"install the {extra!r} extra: pip install 'edge-inference[{extra}]'"
            if extra
            else "it comes with edge-inference itself: reinstall it (pip install edge-inference)"
        )
        raise MissingExtraError(
            f"{purpose} needs {package}, which is not installed here; {where}"
        ) from exc
