"""The models the gateway serves: a model repository on disk, loaded through a backend.

Every version of every package in the repository directory is loaded (the
newest is served unless a request names a version). The directory is
re-scanned every ``poll_interval_s``: new versions are loaded, changed ones
reloaded and swapped in, removed ones unloaded, all without a restart.
``load`` and ``unload`` do the same on demand (the repository API).

The backend is a seam: :class:`EmbeddedBackend` runs models in this process
with the agent's runtime layer (ONNX Runtime with the gateway's execution
providers). A remote engine's models
(:class:`cloud_gateway.remote.RemoteBackend`: Triton, KServe, MLServer) are
the same :class:`LoadedModel` values with a ``forward`` coroutine instead of a
blocking ``run``; they join the repository with :meth:`ServingRepository.set_remote`
and are served beside the local ones (a local model of the same name wins).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edge_core.errors import BadRequest, EdgeError, NotFound, PackageError, Unavailable
from edge_core.manifest import load_package
from edge_core.names import parse_version
from edge_core.package import MANIFEST, ModelPackage
from edge_core.protocol.types import InferRequest, InferResponse
from edge_core.runtime import RuntimeOptions, open_best, open_variant
from edge_core.tensors import TensorSpec

__all__ = ["Backend", "EmbeddedBackend", "LoadedModel", "ServingRepository", "fingerprint"]

log = logging.getLogger(__name__)

Array = np.ndarray[Any, Any]


def _always() -> bool:
    return True


@dataclass
class LoadedModel:
    """A model version ready to run. ``run`` is thread-safe and blocking.

    ``forward``: a remote engine's model, run by that coroutine on the event loop
    (the whole request and its deadline), never batched here; ``is_ready``: whether
    it can take requests now (a remote engine's health).
    """

    package: ModelPackage
    variant: str
    platform: str
    device: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    run: Callable[[dict[str, Array]], dict[str, Array]]
    fingerprint: tuple[Any, ...] = ()
    close: Callable[[], None] = field(default=lambda: None)
    forward: Callable[[InferRequest, float | None], Awaitable[InferResponse]] | None = None
    is_ready: Callable[[], bool] = field(default=_always)

    @property
    def batchable(self) -> bool:
        """Whether every input and output has a dynamic batch dimension."""
        return all(spec.shape and spec.shape[0] < 0 for spec in (*self.inputs, *self.outputs))


class Backend(Protocol):
    def load(self, package: ModelPackage) -> LoadedModel:
        """Load a package. Raises an ``EdgeError`` when it cannot."""
        ...


class EmbeddedBackend:
    """Runs models in this process through :mod:`edge_core.runtime`."""

    def __init__(
        self,
        options: RuntimeOptions,
        precisions: tuple[str, ...] = ("fp32", "int8", "fp16"),
        formats: tuple[str, ...] = ("onnx", "tflite"),
        *,
        variant: str | None = None,
    ) -> None:
        """``variant``: always this variant id (else the best by preference)."""
        self.options = options
        self.precisions = precisions
        self.formats = formats
        self.variant = variant

    def load(self, package: ModelPackage) -> LoadedModel:
        if self.variant is not None:
            variant = package.variant(self.variant)
            session = open_variant(package, variant, self.options)
        else:
            variant, session = open_best(
                package,
                self.options,
                precisions=self.precisions,
                formats=self.formats,
                profile_name="the gateway's configuration",
            )
        return LoadedModel(
            package=package,
            variant=variant.id,
            platform=f"{session.backend}_{variant.format}",
            device=session.device,
            inputs=session.inputs,
            outputs=session.outputs,
            run=session.run,
            close=session.close,
        )


def fingerprint(root: Path) -> tuple[Any, ...]:
    """What changes when a package's files change (names, sizes, modification times)."""
    entries = []
    for path in sorted(root.iterdir()):
        if path.is_file():
            stat = path.stat()
            entries.append((path.name, stat.st_size, stat.st_mtime_ns))
    return tuple(entries)


@dataclass
class _Failure:
    reason: str
    fingerprint: tuple[Any, ...]


class ServingRepository:
    """The loaded model versions, by name and version. Thread-safe reads."""

    def __init__(self, root: Path, backend: Backend) -> None:
        self.root = Path(root)
        self.backend = backend
        self._models: dict[str, dict[int, LoadedModel]] = {}
        self._failures: dict[tuple[str, int], _Failure] = {}
        self._unloaded: set[str] = set()  # names unloaded on request: not reloaded by scans
        self._remote: dict[str, dict[str, dict[int, LoadedModel]]] = {}  # engine -> models
        self._lock = threading.Lock()

    def _on_disk(self) -> dict[tuple[str, int], Path]:
        found: dict[tuple[str, int], Path] = {}
        if not self.root.is_dir():
            return found
        for folder in self.root.iterdir():
            if not folder.is_dir():
                continue
            for child in folder.iterdir():
                try:
                    version = parse_version(child.name)
                except BadRequest:
                    continue  # not a version folder
                if version is not None and (child / MANIFEST).is_file():
                    found[(folder.name, version)] = child
        return found

    def scan(self, only: str | None = None) -> tuple[list[LoadedModel], list[LoadedModel]]:
        """Bring the loaded models in line with the directory. Blocking (loads models).

        Returns the models loaded (new or replacing an old version) and the
        ones removed, so the caller can start and stop what serves them.
        """
        on_disk = self._on_disk()
        added: list[LoadedModel] = []
        removed: list[LoadedModel] = []
        for (name, version), path in sorted(on_disk.items()):
            if (only is not None and name != only) or name in self._unloaded:
                continue
            current = self._models.get(name, {}).get(version)
            try:
                stamp = fingerprint(path)
            except OSError:
                continue  # being written: next scan
            failure = self._failures.get((name, version))
            if (current is not None and current.fingerprint == stamp) or (
                failure is not None and failure.fingerprint == stamp
            ):
                continue
            try:
                package = load_package(path)
                if package.name != name:
                    raise PackageError(
                        f"manifest name {package.name!r} differs from its folder {name!r}"
                    )
                model = self.backend.load(package)
            except EdgeError as exc:
                log.error("cannot load %s version %d: %s", name, version, exc)
                self._failures[(name, version)] = _Failure(str(exc), stamp)
                continue
            model.fingerprint = stamp
            self._failures.pop((name, version), None)
            with self._lock:
                self._models.setdefault(name, {})[version] = model
            if current is not None:
                removed.append(current)
            added.append(model)
            log.info(
                "%s %s:%d (%s on %s)",
                "reloaded" if current else "loaded",
                name,
                version,
                model.variant,
                model.device,
            )
        for name, versions in list(self._models.items()):
            if only is not None and name != only:
                continue
            for version in list(versions):
                if (name, version) not in on_disk:
                    with self._lock:
                        model = versions.pop(version)
                        if not versions:
                            del self._models[name]
                    removed.append(model)
                    log.info("unloaded %s:%d (gone from the repository)", name, version)
        return added, removed

    def load(self, name: str) -> tuple[list[LoadedModel], list[LoadedModel]]:
        """Load (or reload) every version of ``name`` on request.

        Raises:
            NotFound: the repository has no such model.
        """
        if not any(n == name for n, _ in self._on_disk()):
            raise NotFound(f"the repository has no model {name!r}")
        self._unloaded.discard(name)
        for key in [k for k in self._failures if k[0] == name]:
            del self._failures[key]
        added, removed = self.scan(only=name)
        if name not in self._models:
            reasons = [f.reason for (n, _), f in self._failures.items() if n == name]
            raise Unavailable(f"model {name!r} failed to load: {'; '.join(reasons)}")
        return added, removed

    def unload(self, name: str) -> list[LoadedModel]:
        """Unload every version of ``name`` until it is loaded again on request.

        Raises:
            NotFound: no such model is loaded.
        """
        with self._lock:
            versions = self._models.pop(name, None)
        if versions is None:
            raise NotFound(f"model {name!r} is not loaded")
        self._unloaded.add(name)
        log.info("unloaded %s on request", name)
        return list(versions.values())

    def set_remote(self, engine: str, models: list[LoadedModel]) -> None:
        """The models ``engine`` serves now (replacing what it served before)."""
        served: dict[str, dict[int, LoadedModel]] = {}
        for model in models:
            served.setdefault(model.package.name, {})[model.package.version] = model
        with self._lock:
            self._remote = {**self._remote, engine: served}

    def _versions(self, name: str) -> dict[int, LoadedModel] | None:
        versions = self._models.get(name)
        if versions:
            return versions
        for served in self._remote.values():
            if name in served:
                return served[name]
        return None

    def get(self, name: str, version: int | None = None) -> LoadedModel:
        """The loaded model ``name`` at ``version`` (``None``: the newest). A dict
        lookup: nothing of the name or the version reaches the filesystem.

        Raises:
            NotFound: no such model or version is loaded.
        """
        versions = self._versions(name)
        if not versions:
            raise NotFound(f"unknown model {name!r}")
        if version is None:
            return versions[max(versions)]
        if version not in versions:
            known = ", ".join(str(v) for v in sorted(versions))
            raise NotFound(f"model {name!r} has no version '{version}'; loaded versions: {known}")
        return versions[version]

    def versions(self, name: str) -> list[int]:
        return sorted(self._versions(name) or {})

    def loaded(self) -> Iterator[LoadedModel]:
        for versions in list(self._models.values()):
            yield from list(versions.values())
        for served in list(self._remote.values()):
            for name, versions in served.items():
                if name not in self._models:
                    yield from list(versions.values())

    def index(self) -> list[dict[str, Any]]:
        """Every model version on disk with its state (READY, UNAVAILABLE, UNLOADED)."""
        rows = []
        for name, version in sorted(self._on_disk()):
            entry: dict[str, Any] = {"name": name, "version": str(version)}
            failure = self._failures.get((name, version))
            if version in self._models.get(name, {}):
                entry["state"] = "READY"
            elif failure is not None:
                entry["state"] = "UNAVAILABLE"
                entry["reason"] = failure.reason
            else:
                entry["state"] = "UNLOADED" if name in self._unloaded else "LOADING"
            rows.append(entry)
        for engine, served in sorted(self._remote.items()):
            for name, versions in sorted(served.items()):
                if name in self._models:
                    continue
                for version, model in sorted(versions.items()):
                    state = "READY" if model.is_ready() else "UNAVAILABLE"
                    remote = {"name": name, "version": str(version), "state": state}
                    if state != "READY":
                        remote["reason"] = f"engine {engine} is down"
                    rows.append(remote)
        return rows
