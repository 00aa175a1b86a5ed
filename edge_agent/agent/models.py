"""The models on the device: which package and variant the agent serves for a
name, loading and warming them up on first use, swapping in new versions, and
whether one more fits the profile's memory budget.

:class:`LocalModels` owns its caches and the one lock that guards them:

- the packages found (manifests only: a package decrypted into memory does not
  stay there twice), and a bounded LRU of names not found, so a request for
  an unknown name costs no disk lookup the second time and a stream of
  distinct unknown names cannot grow the agent's memory;
- the variant each package would run under the precision order in force;
- the loaded models (:class:`LocalModel`), each with its latency estimate and
  the requests running on it now.

Before a model has been timed, its latency prior is the roofline prediction of
its variant's cost (counted by ``models build``, in the manifest) on the
profile's compute and bandwidth figures (:func:`prior_ms`); the fixed
:data:`UNTIMED_LOCAL_MS` only where either is missing.

Loading one model does not hold up requests for the others; a request that
waits for a model to load is told how long (its latency leaves that out).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from edge_agent.agent.sources import ModelSource
from edge_agent.policy import LatencyEstimate
from edge_agent.profiles.cost import predict_ms
from edge_agent.profiles.schema import DeviceProfile
from edge_core.errors import EdgeError, ModelNotFoundError, NoVariantError
from edge_core.names import is_model_name
from edge_core.package import ModelPackage, Variant
from edge_core.runtime import Session, open_best, rank_variants
from edge_core.runtime.selection import installed_formats

__all__ = ["MEMORY_FACTOR", "UNTIMED_LOCAL_MS", "LocalModel", "LocalModels", "Timing"]

log = logging.getLogger(__name__)

Array = np.ndarray[Any, Any]
# A loaded model holds about its file's size once more in the runtime's own structures.
MEMORY_FACTOR = 2.0
# What the local fallback is assumed to need before it has been timed, when neither its
# manifest gives its cost nor the profile its compute figures.
UNTIMED_LOCAL_MS = 50.0
# Names looked up and not found, remembered (a cloud-only model is asked for on every
# request); the oldest are forgotten.
MISSES_KEPT = 256


@dataclass
class Timing:
    """When a request started, and how long it waited for models to load: its
    latency is its own time, without loading and warming up a model."""

    started: float
    load_s: float = 0.0

    def latency_ms(self, now: float) -> float:
        return (now - self.started - self.load_s) * 1000

    @property
    def load_ms(self) -> float | None:
        return self.load_s * 1000 if self.load_s > 0 else None


@dataclass
class LocalModel:
    package: ModelPackage
    variant: Variant
    session: Session
    estimate: LatencyEstimate = field(default_factory=LatencyEstimate)
    running: int = 0  # requests running on it now (the queue ahead of the next one)


class LocalModels:
    """The models the device serves, loaded on first use."""

    def __init__(
        self,
        profile: DeviceProfile,
        source: ModelSource,
        *,
        clock: Callable[[], float] = time.monotonic,
        misses_kept: int = MISSES_KEPT,
    ) -> None:
        self.profile = profile
        self.source = source
        self._clock = clock
        self._misses_kept = misses_kept
        self._lock = threading.Lock()
        self._local: dict[str, LocalModel] = {}
        self._loading: dict[str, threading.Lock] = {}
        self._packages: dict[str, ModelPackage] = {}
        self._misses: OrderedDict[str, None] = OrderedDict()
        self._best: dict[tuple[str, int, tuple[str, ...]], tuple[ModelPackage, Variant | None]] = {}
        self._precision: str | None = None  # preferred over the profile's order (when hot)

    # -- packages ------------------------------------------------------------------------

    def package(self, name: str) -> ModelPackage | None:
        """The package of ``name`` the agent serves (``None``: not on the device).

        A name that breaks the model-name rule is never looked up.
        """
        with self._lock:
            known = self._packages.get(name)
            if known is not None:
                return known
            if name in self._misses:
                self._misses.move_to_end(name)
                return None
        package: ModelPackage | None = None
        if is_model_name(name):
            try:
                package = self.source.get(name)
            except ModelNotFoundError:
                package = None
        with self._lock:
            if package is None:
                self._misses[name] = None
                while len(self._misses) > self._misses_kept:
                    self._misses.popitem(last=False)
                return None
            package = replace(package, contents={}) if package.contents else package
            return self._packages.setdefault(name, package)

    def best_variant(self, package: ModelPackage) -> Variant | None:
        """The variant this device would run (remembered per package and precision
        order: the policy asks on every request)."""
        precisions = self.precisions
        key = (package.name, package.version, precisions)
        known = self._best.get(key)
        if known is not None and known[0] is package:
            return known[1]
        try:
            best: Variant | None = rank_variants(
                package,
                precisions=precisions,
                formats=self.profile.formats,
                installed=installed_formats(),
            )[0]
        except NoVariantError:
            best = None
        with self._lock:
            self._best[key] = (package, best)
        return best

    def prior_ms(self, variant: Variant | None) -> float | None:
        """The latency ``variant`` is predicted to take here before it has been timed:
        its cost on the profile's roofline (``None`` when either is unknown)."""
        if variant is None or variant.cost is None or self.profile.cost is None:
            return None
        return predict_ms(variant.cost, self.profile.cost)

    def fits(self, variant: Variant, name: str) -> bool:
        """Whether ``variant`` of ``name`` fits the memory budget beside the others loaded."""
        with self._lock:
            others = [local.variant.size for key, local in self._local.items() if key != name]
        used = sum(others) * MEMORY_FACTOR
        needed = variant.size * MEMORY_FACTOR
        return used + needed <= self.profile.memory_budget_mb * 1024 * 1024

    # -- loaded models -------------------------------------------------------------------

    def loaded_model(self, name: str) -> LocalModel | None:
        """The loaded model of ``name``, without loading it."""
        return self._local.get(name)

    def get(self, name: str, timing: Timing | None = None) -> LocalModel:
        """The loaded model (loaded and warmed up on first use); the time spent
        loading it (or waiting for another request to) goes to ``timing``.

        Raises:
            ModelNotFoundError, NoVariantError: the device cannot run it.
        """
        local = self._local.get(name)
        if local is not None:
            return local
        started = self._clock()
        try:
            with self._lock:
                lock = self._loading.setdefault(name, threading.Lock())
            with lock:
                local = self._local.get(name)
                if local is None:
                    if self.package(name) is None:
                        raise ModelNotFoundError(f"unknown model {name!r:.140}")
                    local = self._load(self.source.get(name))
                    with self._lock:
                        self._local[name] = local
                return local
        finally:
            if timing is not None:
                timing.load_s += self._clock() - started

    def _load(self, package: ModelPackage) -> LocalModel:
        variant, session = open_best(
            package,
            self.profile.runtime,
            precisions=self.precisions,
            formats=self.profile.formats,
            profile_name=f"profile {self.profile.id}",
        )
        local = LocalModel(
            replace(package, contents={}) if package.contents else package, variant, session
        )
        zeros = {
            spec.name: np.zeros([d if d > 0 else 1 for d in spec.shape], spec.dtype)
            for spec in session.inputs
        }
        self.run(local, zeros)  # a first timing, for the deadline arithmetic
        return local

    def run(self, local: LocalModel, arrays: dict[str, Array]) -> dict[str, Array]:
        """Run ``local`` on ``arrays``, counted as running meanwhile and timed."""
        with self._lock:
            local.running += 1
        started = self._clock()
        try:
            outputs = local.session.run(arrays)
        finally:
            with self._lock:
                local.running -= 1
        local.estimate.observe((self._clock() - started) * 1000)
        return outputs

    def reload(self, name: str, package: ModelPackage | None = None) -> None:
        """Swap in a new version of ``name`` (e.g. just installed over the air).

        The new version is loaded and warmed up first; requests already running
        finish on the old one, which is then dropped. Nothing fails meanwhile.
        """
        fresh = self._load(package or self.source.get(name))
        with self._lock:
            self._packages[name] = fresh.package
            self._misses.pop(name, None)
            self._local[name] = fresh
            for key in list(self._best):
                if key[0] == name and key[1] != fresh.package.version:
                    del self._best[key]  # a version no longer served
        log.info("now serving %s (%s)", fresh.package.qualified_name, fresh.variant.id)

    # -- precision -----------------------------------------------------------------------

    @property
    def precisions(self) -> tuple[str, ...]:
        """The precision order in force: the profile's, or a preferred one first."""
        if self._precision is None:
            return self.profile.precisions
        rest = tuple(p for p in self.profile.precisions if p != self._precision)
        return (self._precision, *rest)

    def prefer_precision(self, precision: str | None) -> None:
        """Prefer ``precision`` (``int8`` when the device runs hot), or go back to the
        profile's order (``None``). Loaded models whose best variant changes are
        reloaded, the new variant warmed up before it takes over."""
        self._precision = precision
        with self._lock:
            loaded = list(self._local.items())
        for name, local in loaded:
            best = self.best_variant(local.package)
            if best is not None and best.id != local.variant.id:
                try:
                    self.reload(name)
                except EdgeError as exc:
                    log.warning("cannot switch %s to %s: %s", name, best.id, exc)

    # -- views ---------------------------------------------------------------------------

    def loaded(self) -> dict[str, dict[str, Any]]:
        """The models loaded on the device: their versions and variants (a copy)."""
        with self._lock:
            local = dict(self._local)
        return {
            name: {"version": entry.package.version, "variant": entry.variant.id}
            for name, entry in sorted(local.items())
        }

    def names(self) -> list[str]:
        """The models the device has (bundled, or installed over the air)."""
        return [name for name in self.source.names() if is_model_name(name)]

    def rankings(self) -> list[tuple[str, int, tuple[str, ...]]]:
        """The (model, version, precision order) whose best variant is remembered."""
        with self._lock:
            return sorted(self._best)

    def backend_of(self, name: str) -> str | None:
        local = self._local.get(name)
        return local.session.backend if local is not None else None

    def close(self) -> None:
        with self._lock:
            loaded = list(self._local.values())
        for local in loaded:
            local.session.close()
