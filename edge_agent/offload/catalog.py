"""What the cloud can answer: the gateway's models and protocol extensions, as far as
this device has learnt them. One catalog per gateway (the configured address or
replica set: replicas share one repository).

- The repository's index (the names the gateway serves) and its extensions, listed
  every :data:`INDEX_TTL_S` (:data:`RECHECK_S` once a request asks for a model the
  index lacks) in a thread of its own, started by the request that finds them stale
  (and by the service at start): no request waits for them. A model the index does not
  list is one the cloud lacks; before the first index (or where it cannot be asked:
  MQTT carries requests only) every model is taken as present, as before.
- An offload refused as *not found* marks its model missing at once
  (:meth:`CloudCatalog.missing`), until the next index lists it.
- A model's metadata (the inputs it takes), asked the first time a request for a
  model the device does not hold would leave, within a budget of its deadline, and
  kept :data:`METADATA_TTL_S`: a request that does not fit is refused here, before
  any byte leaves. A question that failed is not asked again for :data:`FAILED_TTL_S`.
- The extensions (whether the gateway takes pictures encoded, ``edge_pictures``, and
  packed tensors, ``edge_compression``): listed with the index, or asked within the
  budget of the first request that needs them; an MQTT transport learns them from
  its answers.

Bounded: :data:`ENTRIES` names in the index and as many models' metadata and missing
marks (the least recently used forgotten); one question about a model at a time (the
others wait for its answer, within their own budget), one listing at a time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edge_agent.offload.base import Transport
from edge_core.errors import ModelNotFoundError
from edge_core.tensors import TensorSpec

__all__ = ["CloudCatalog", "CloudModel"]

log = logging.getLogger(__name__)

ENTRIES = 1024
INDEX_TTL_S = 60.0
RECHECK_S = 10.0  # an index that lacks a model asked for is listed again after this
METADATA_TTL_S = 300.0
MISSING_TTL_S = 300.0  # a model refused as not found, until an index lists it again
FAILED_TTL_S = 5.0  # the gateway could not be asked: not again for this long


@dataclass(frozen=True)
class CloudModel:
    """One model as the gateway described it (``inputs`` empty: it could not be asked)."""

    name: str
    inputs: tuple[TensorSpec, ...]
    learnt: float
    failed: bool = False


class CloudCatalog:
    """The gateway's models and extensions, learnt through ``transport`` (thread-safe)."""

    def __init__(
        self,
        transport: Transport,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_exchange: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        """``on_exchange(seconds)``: each answered small question's time (all round
        trip: what the link estimator learns the round trip from)."""
        self.transport = transport
        self._clock = clock
        self._on_exchange = on_exchange
        self._lock = threading.Condition()
        self._index: frozenset[str] | None = None
        self._index_at = float("-inf")
        self._refreshing = False
        self._missing: OrderedDict[str, float] = OrderedDict()
        self._metadata: OrderedDict[str, CloudModel] = OrderedDict()
        self._asking: set[str] = set()
        self._extensions: frozenset[str] | None = None
        self._extensions_at = float("-inf")
        self.questions = 0

    # -- what is known --------------------------------------------------------------------

    def lacks(self, model: str) -> bool:
        """Whether the cloud is known not to have ``model`` (no question asked here; a
        stale index is listed again in the background, and so is one that lacks the
        model and is older than :data:`RECHECK_S`: a model published since is found soon)."""
        self.refresh_in_background()
        now = self._clock()
        with self._lock:
            told = self._missing.get(model)
            if told is not None and now - told <= MISSING_TTL_S:
                return True
            index, age = self._index, now - self._index_at
        absent = index is not None and model not in index
        if absent and age > RECHECK_S:
            self.refresh_in_background(RECHECK_S)
        return absent

    def missing(self, model: str) -> None:
        """An offload for ``model`` (any version) was refused as not found."""
        with self._lock:
            self._missing[model] = self._clock()
            self._missing.move_to_end(model)
            while len(self._missing) > ENTRIES:
                self._missing.popitem(last=False)
            self._metadata.pop(model, None)

    def index(self) -> frozenset[str] | None:
        """The names the cloud serves, as last listed (``None``: never listed)."""
        return self._index

    def known_extensions(self) -> frozenset[str]:
        """The gateway's extensions as last learnt (nothing asked; empty: unknown)."""
        return self._extensions or frozenset()

    def learn_extensions(self, extensions: frozenset[str]) -> None:
        """The gateway's extensions, as an answer named them (MQTT)."""
        self._extensions, self._extensions_at = extensions, self._clock()

    # -- questions --------------------------------------------------------------------------

    def extensions(self, *, timeout: float) -> frozenset[str]:
        """The gateway's protocol extensions: kept, or asked within ``timeout`` seconds
        (empty when they cannot be known: nothing is assumed of the gateway)."""
        if self._clock() - self._extensions_at >= INDEX_TTL_S:
            self._ask_extensions(timeout)
        return self._extensions or frozenset()

    def _ask_extensions(self, timeout: float) -> None:
        now = self._clock()
        try:
            document = self._timed(lambda: self.transport.server_metadata(timeout=timeout))
        except Exception as exc:  # OffloadError, or a transport closed under it
            log.debug("the gateway's extensions could not be asked: %s", exc)
            document = None
        found = None
        if document is not None and isinstance(document.get("extensions"), list):
            found = frozenset(str(e) for e in document["extensions"][:64])
        if found is not None or self._extensions is None:
            self._extensions = found
        # unknown: asked again soon; known: kept as long as the index
        self._extensions_at = now if found is not None else now - INDEX_TTL_S + FAILED_TTL_S

    def metadata(self, model: str, *, timeout: float) -> CloudModel | None:
        """What the gateway says ``model`` takes: kept, or asked within ``timeout``
        seconds (``None``: it cannot be known now; the gateway checks the request).

        Raises:
            ModelNotFoundError: the gateway does not have it (it is marked missing).
        """
        if self.lacks(model):
            raise ModelNotFoundError(f"the cloud does not have {model}")
        end = self._clock() + max(timeout, 0.0)
        with self._lock:  # one question about a model at a time: the others wait for it
            while model in self._asking:
                left = end - self._clock()
                if left <= 0 or not self._lock.wait(left):
                    return None
            kept = self._kept(model)
            if kept is not None:
                return None if kept.failed else kept
            self._asking.add(model)
        try:
            entry = self._ask(model, timeout)
        finally:
            with self._lock:
                self._asking.discard(model)
                self._lock.notify_all()
        return None if entry.failed else entry

    def _kept(self, model: str) -> CloudModel | None:
        """Under the lock: what is kept of ``model`` and still fresh."""
        entry = self._metadata.get(model)
        if entry is None:
            return None
        ttl = FAILED_TTL_S if entry.failed else METADATA_TTL_S
        if self._clock() - entry.learnt > ttl:
            return None
        self._metadata.move_to_end(model)
        return entry

    def _ask(self, model: str, timeout: float) -> CloudModel:
        try:
            document = self._timed(lambda: self.transport.model_metadata(model, timeout=timeout))
        except ModelNotFoundError:
            self.missing(model)
            raise ModelNotFoundError(f"the cloud does not have {model}") from None
        except Exception as exc:  # OffloadError, or a transport closed under it
            log.debug("the metadata of %s could not be asked: %s", model, exc)
            document = None
        if document is None:
            entry = CloudModel(model, (), self._clock(), failed=True)
        else:
            entry = CloudModel(model, _specs(document.get("inputs")), self._clock())
        with self._lock:
            self._metadata[model] = entry
            self._metadata.move_to_end(model)
            while len(self._metadata) > ENTRIES:
                self._metadata.popitem(last=False)
        return entry

    def _timed(self, question: Callable[[], Any]) -> Any:
        """A small question's answer, its time told to ``on_exchange``."""
        self.questions += 1
        started = self._clock()
        answer = question()
        if answer is not None:
            self._on_exchange(self._clock() - started)
        return answer

    # -- the index, in the background -------------------------------------------------------

    def refresh_in_background(self, ttl: float = INDEX_TTL_S) -> None:
        """List the gateway's models (and its extensions) in a thread of its own, unless
        the index is younger than ``ttl`` seconds, a listing is under way, or this
        transport cannot list."""
        if not self.transport.asks_the_gateway:
            return
        with self._lock:
            if self._refreshing or self._clock() - self._index_at < ttl:
                return
            self._refreshing = True
        threading.Thread(target=self.refresh, name="cloud-catalog", daemon=True).start()

    def refresh(self, timeout: float = 5.0) -> None:
        """List the gateway's models now, and its extensions when they are stale (what
        the background refresh runs)."""
        if self._clock() - self._extensions_at >= INDEX_TTL_S:
            self._ask_extensions(timeout)
        try:
            self.questions += 1  # not timed: a large index is no round trip
            listed = self.transport.repository_index(timeout=timeout)
        except Exception as exc:  # OffloadError, or a transport closed under it
            log.debug("the gateway's index could not be listed: %s", exc)
            listed = None
        now = self._clock()
        with self._lock:
            self._refreshing = False
            if listed is None:  # asked again in a while, the old index kept
                self._index_at = now - INDEX_TTL_S + FAILED_TTL_S
                return
            names = {
                str(entry.get("name"))
                for entry in listed
                if isinstance(entry, dict) and entry.get("state") == "READY"
            }
            # an index too large to keep is not kept: every model is taken as present
            self._index = frozenset(names) if len(names) <= ENTRIES else None
            self._index_at = now
            for name in self._index or ():
                self._missing.pop(name, None)


def _specs(inputs: Any) -> tuple[TensorSpec, ...]:
    """The inputs of a metadata document (what cannot be read is left out: the gateway
    checks again)."""
    specs = []
    for item in inputs if isinstance(inputs, list) else ():
        try:
            specs.append(
                TensorSpec(
                    name=str(item["name"]),
                    datatype=str(item["datatype"]),
                    shape=tuple(int(d) for d in item["shape"]),
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return tuple(specs)
