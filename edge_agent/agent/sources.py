"""Where the agent's models come from: a :class:`ModelSource` gives the package
to run for a name. The bundled repository is one (``ModelRepository``); the
models installed over the air (:class:`OtaSource`) come first when there are
any (:class:`LayeredSource`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edge_core.errors import ModelNotFoundError
from edge_core.package import ModelPackage
from edge_core.repository import ModelSource

__all__ = ["LayeredSource", "ModelSource", "OtaSource"]


class LayeredSource:
    """The first source that has a model: e.g. updates installed over the air, then
    the bundled models."""

    def __init__(self, sources: Sequence[ModelSource]) -> None:
        self.sources = list(sources)

    def get(self, name: str) -> ModelPackage:
        for source in self.sources:
            try:
                return source.get(name)
            except ModelNotFoundError:
                continue
        raise ModelNotFoundError(f"unknown model {name!r}")

    def names(self) -> list[str]:
        return sorted({name for source in self.sources for name in source.names()})


class OtaSource:
    """The models installed over the air: each one's active slot, decrypted into memory.

    ``store`` is an :class:`~edge_agent.ota.OtaStore` (typed loosely: the OTA
    package, and python-tuf with it, is imported only by devices that update).
    """

    def __init__(self, store: Any, group: str, group_key: bytes) -> None:
        self.store = store
        self.group = group
        self.group_key = group_key

    def get(self, name: str) -> ModelPackage:
        if self.store.active(name) is None:
            raise ModelNotFoundError(f"no update of {name!r} is installed")
        package: ModelPackage = self.store.package(name, self.group, self.group_key)
        return package

    def names(self) -> list[str]:
        return [name for name in self.store.names() if self.store.active(name) is not None]
