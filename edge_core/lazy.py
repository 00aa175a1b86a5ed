"""A package's public names, loaded when first used (PEP 562).

``edge_agent`` and ``cloud_gateway`` export their API from ``__init__`` without
importing it: ``import cloud_gateway.batching`` must not load gRPC, nor ``import
edge_agent.config`` the runtimes. Each lists its names and their modules once.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, namespace: dict[str, Any], exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's ``__getattr__`` and ``__dir__``: a name of ``exports`` (name ->
    its module) is imported on first use and kept in ``namespace`` (the package's
    globals), so that later lookups do not come back; ``dir()`` is its ``__all__``."""

    def getattr_(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return list(namespace.get("__all__", exports))

    return getattr_, dir_
