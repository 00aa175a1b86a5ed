"""A remote backend: models that an existing serving engine runs for the gateway.

The workflow, for each ``[[backends]]`` entry:

1. at start and at every health check (``health_interval_s``), the engine's
   readiness is asked (``ServerReady`` / ``GET /v2/health/ready``);
2. while it is ready, its models are discovered: the configured names, or
   every model its repository index lists as ``READY``, each with its
   metadata (inputs, outputs, versions). They join the gateway's serving
   repository as :class:`~cloud_gateway.repository.LoadedModel` values with a
   ``forward`` coroutine, so the data plane treats them like its own models:
   the device's token, group, rate limit, the request's checks against the
   model's metadata, its deadline and metrics stay the gateway's;
3. a request is forwarded as it came (its outputs and id, and of its parameters
   those the entry's ``forward_parameters`` names: none by default; to an HTTP
   engine, a device's binary tensors as the very bytes it sent under a header
   written again from what was checked, and the engine's binary answer relayed as
   it is when it is what the gateway would answer), on the event loop, with at
   most ``max_in_flight`` out at once; it waits for a place within its deadline.
   The gateway never batches these models: the engine has its own batcher, and
   two in a row only add their delays;
4. an engine that stops answering (a failed health check, or a request that
   could not reach it) makes its models unready at once: a request for one is
   answered 503 without waiting for a connection, the gateway's readiness says
   which engine is down, and the next successful check brings them back.

Versions: an engine model's integer versions are kept; a model without one
(MLServer's, unless its settings name one) is served as version 1 here and
forwarded without a version.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from cloud_gateway.config import BackendSettings
from cloud_gateway.remote.engine import Engine, EngineUnreachable, make_engine
from cloud_gateway.repository import LoadedModel
from edge_core.errors import (
    ConfigError,
    DeadlineExceeded,
    EngineError,
    EngineUnavailable,
    RequestError,
)
from edge_core.fields import is_decimal
from edge_core.names import is_model_name
from edge_core.package import ModelPackage
from edge_core.protocol.types import InferRequest, InferResponse
from edge_core.tensors import TensorSpec

__all__ = ["RemoteBackend", "read_token"]

log = logging.getLogger(__name__)

Array = np.ndarray[Any, Any]

# The share of the time left kept for an answer or a refusal to travel back (at most
# 20 ms), as the agent keeps it for the gateway's answer.
ANSWER_MARGIN = 0.1
MAX_ANSWER_MARGIN_S = 0.02


def read_token(path: Path | None) -> str | None:
    """The engine's token from its file (``None`` without one).

    Raises:
        ConfigError: unreadable, empty, or readable by others.
    """
    if path is None:
        return None
    try:
        mode = path.stat().st_mode
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"the engine's token file: {exc}", path=path) from None
    if mode & 0o077:
        mode_text = oct(mode & 0o777)
        raise ConfigError(f"readable by others (mode {mode_text}); expected 0600", path=path)
    if not token:
        raise ConfigError("the engine's token file is empty", path=path)
    return token


def _version(text: str) -> int | None:
    """An engine's version string as a version (ASCII digits: ``str.isdigit`` also takes
    "²", which ``int()`` then refuses), else ``None``."""
    return int(text) if is_decimal(text) and 1 <= len(text) <= 9 and int(text) >= 1 else None


def _specs(items: Any, where: str) -> tuple[TensorSpec, ...]:
    if not isinstance(items, list):
        return ()
    try:
        return tuple(
            TensorSpec(str(t["name"]), str(t["datatype"]), tuple(int(d) for d in t["shape"]))
            for t in items
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise EngineError(f"{where}: unusable tensor metadata: {exc!r:.200}") from exc


class RemoteBackend:
    """One engine's models and their health. Used on the gateway's event loop only."""

    def __init__(
        self,
        settings: BackendSettings,
        *,
        engine: Engine | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Raises: ConfigError (the token file). The engine's client is made on the
        event loop, when first used (a ``grpc.aio`` channel belongs to one loop)."""
        self.settings = settings
        self._engine = engine
        self._token = read_token(settings.token_file) if engine is None else None
        self.name = settings.name or settings.url
        self.up = False
        self.reason = "not checked yet"
        self.models: list[LoadedModel] = []
        self._clock = clock
        self._slots: asyncio.Semaphore | None = None
        self._discovered = False

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = make_engine(self.settings, self._token)
        return self._engine

    # -- health and discovery ---------------------------------------------------------------

    async def check(self) -> bool:
        """Ask the engine whether it is ready; discover its models when it comes up.
        Returns whether the set of models changed."""
        ready = await self.engine.ready()
        if not ready:
            self._down("it does not answer its readiness check, or says it is not ready")
            return False
        if self._discovered:
            if not self.up:
                log.info("engine %s is back", self.name)
            self.up, self.reason = True, ""
            return False
        try:
            self.models = await self._discover()
        except RequestError as exc:
            self._down(f"its models could not be listed: {exc}")
            return False
        self._discovered = True
        self.up, self.reason = True, ""
        log.info(
            "engine %s serves %s",
            self.name,
            ", ".join(m.package.qualified_name for m in self.models) or "no model",
        )
        return True

    def _down(self, why: str) -> None:
        if self.up:
            log.warning("engine %s is down: %s", self.name, why)
        self.up, self.reason = False, why

    async def _discover(self) -> list[LoadedModel]:
        await self.engine.prepare()
        wanted = self.settings.models
        if wanted is None:
            # MLServer 1.7's gRPC index says "State.READY" (its enum's str), its REST "READY"
            names = sorted(
                {
                    e["name"]
                    for e in await self.engine.index()
                    if e["state"].rpartition(".")[2].upper() == "READY"
                }
            )
        else:
            names = list(wanted)
        models = []
        for name in names:
            if not is_model_name(name):
                log.warning("engine %s: model %r has a name the gateway refuses", self.name, name)
                continue
            meta = await self.engine.metadata(name, "")
            where = f"engine {self.name}, model {name}"
            inputs, outputs = _specs(meta.get("inputs"), where), _specs(meta.get("outputs"), where)
            versions: list[int | None] = [
                v for v in (_version(str(x)) for x in meta.get("versions") or []) if v
            ]
            platform = str(meta.get("platform") or "remote")
            for version in versions or [None]:
                models.append(self._model(name, version, platform, inputs, outputs))
        return models

    def _model(
        self,
        name: str,
        version: int | None,
        platform: str,
        inputs: tuple[TensorSpec, ...],
        outputs: tuple[TensorSpec, ...],
    ) -> LoadedModel:
        remote_version = "" if version is None else str(version)
        package = ModelPackage(
            root=Path("."),
            name=name,
            version=version or 1,
            task="remote",
            inputs=inputs,
            outputs=outputs,
            variants=(),
            description=f"served by engine {self.name}",
        )

        async def forward(request: InferRequest, deadline: float | None) -> InferResponse:
            return await self.forward(request, name, remote_version, deadline)

        def run(feed: dict[str, Array]) -> dict[str, Array]:
            raise EngineError(f"model {name} runs on engine {self.name}, only through forward")

        return LoadedModel(
            package=package,
            variant=f"remote:{self.name}",
            platform=platform,
            device=self.name,
            inputs=inputs,
            outputs=outputs,
            run=run,
            forward=forward,
            is_ready=lambda: self.up,
        )

    # -- requests ---------------------------------------------------------------------------

    def _in_flight(self) -> asyncio.Semaphore:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.settings.max_in_flight)
        return self._slots

    async def forward(
        self, request: InferRequest, name: str, version: str, deadline: float | None
    ) -> InferResponse:
        """Run ``request`` on the engine, within ``deadline`` (on this backend's clock).

        Raises:
            EngineUnavailable: the engine is down, or stayed full until the deadline.
            DeadlineExceeded, BadRequest, NotFound, EngineError: as the engine answered.
        """
        if not self.up:
            raise EngineUnavailable(f"model {name}: engine {self.name} is down ({self.reason})")
        if deadline is None:
            deadline = self._clock() + self.settings.timeout_s
        forwarded = self.settings.forward_parameters
        slots = self._in_flight()
        if slots.locked():
            # give up a little before the deadline, for the 503 to reach the caller in time
            wait = deadline - self._clock()
            wait -= min(wait * ANSWER_MARGIN, MAX_ANSWER_MARGIN_S)
            try:
                await asyncio.wait_for(slots.acquire(), max(wait, 0.0))
            except asyncio.TimeoutError:
                raise EngineUnavailable(
                    f"engine {self.name} had {self.settings.max_in_flight} requests in flight "
                    "until the deadline (max_in_flight)"
                ) from None
        else:
            await slots.acquire()
        try:
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise DeadlineExceeded("the deadline passed while waiting for the engine")
            # the engine gives up a little before the caller does: its answer (past the
            # deadline) comes back in time, and its work stops when nobody waits for it
            remaining -= min(remaining * ANSWER_MARGIN, MAX_ANSWER_MARGIN_S)
            outgoing = InferRequest(
                inputs=request.inputs,
                datatypes=request.datatypes,
                model_name=name,
                model_version=version,
                id=request.id,
                outputs=request.outputs,
                parameters={
                    k: v for k, v in request.parameters.items() if k in forwarded and k != "timeout"
                },
                raw=request.raw,
            )
            try:
                return await self.engine.infer(outgoing, remaining)
            except EngineUnreachable as exc:
                self._down(str(exc))
                raise
        finally:
            slots.release()

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.close()
