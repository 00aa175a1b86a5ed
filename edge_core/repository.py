"""A model repository: a directory of packages, ``<root>/<name>/<version>/`` (see
:mod:`edge_core.package`). Names are held to the naming rule before they reach the
filesystem."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from edge_core.errors import ModelNotFoundError
from edge_core.fields import is_decimal
from edge_core.manifest import load_package
from edge_core.package import MANIFEST, ModelPackage

__all__ = ["ModelRepository", "ModelSource"]


class ModelSource(Protocol):
    """Where models come from: a repository, the models installed over the air, or
    both, one before the other."""

    def get(self, name: str) -> ModelPackage:
        """The package to run for ``name``. Raises ``ModelNotFoundError``."""
        ...

    def names(self) -> list[str]:
        """The models it has."""
        ...


class ModelRepository:
    """A directory of model packages (``<root>/<name>/<version>/manifest.json``)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(
            p.name for p in self.root.iterdir() if p.is_dir() and any(self._version_dirs(p.name))
        )

    def _version_dirs(self, name: str) -> Iterator[tuple[int, Path]]:
        folder = self.root / name
        if not folder.is_dir():
            return
        for child in folder.iterdir():
            if is_decimal(child.name) and (child / MANIFEST).is_file():
                yield int(child.name), child

    def versions(self, name: str) -> list[int]:
        return sorted(version for version, _ in self._version_dirs(name))

    def get(self, name: str, version: int | None = None) -> ModelPackage:
        """The package ``name`` at ``version`` (the newest when ``None``).

        Raises:
            ModelNotFoundError: no such model or version.
            PackageError: the package exists but its manifest is wrong.
        """
        versions = self.versions(name)
        if not versions:
            known = ", ".join(self.names()) or "none"
            raise ModelNotFoundError(
                f"unknown model {name!r} in {self.root}; available models: {known}"
            )
        if version is None:
            version = versions[-1]
        elif version not in versions:
            raise ModelNotFoundError(
                f"model {name!r} has no version {version}; available versions: "
                + ", ".join(map(str, versions))
            )
        return load_package(self.root / name / str(version))

    def packages(self) -> Iterator[ModelPackage]:
        """Every version of every model, by name then version."""
        for name in self.names():
            for version in self.versions(name):
                yield load_package(self.root / name / str(version))
