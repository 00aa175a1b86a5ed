"""The protocol-neutral data plane behind both front ends (REST and gRPC).

A front end parses its wire format into an :class:`InferRequest`, authenticates the
caller (:class:`~cloud_gateway.access.Access`: the data plane never sees a token) and
calls :meth:`DataPlane.infer`; the data plane checks the model's name and version
against the one rule of :mod:`edge_core.names` before anything is looked up (a 400
that gives the rule), checks the request against the model (names, datatypes, shapes,
and its size: at most the model's ``max_batch_size`` rows, a free-size picture within
its manifest's pixels, so that no one request takes the memory of many), queues it in
the model's batcher (or runs it directly when batching is off for the model), or, for
a remote engine's model, forwards it on the event loop (never batched here: the engine
batches), keeps its deadline, and returns an :class:`InferResponse`. Every error comes
from the one error tree (:mod:`edge_core.errors`), which the front ends map to
statuses through one table (:mod:`edge_core.status`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np

from cloud_gateway import cpus, pictures
from cloud_gateway.auth import Device
from cloud_gateway.batching import BatchSlots, DynamicBatcher
from cloud_gateway.config import GatewayConfig
from cloud_gateway.metrics import GatewayMetrics
from cloud_gateway.remote.backend import RemoteBackend
from cloud_gateway.repository import LoadedModel, ServingRepository
from edge_core import __version__
from edge_core.errors import BadRequest, DeadlineExceeded, EngineError
from edge_core.names import check_model_name, is_model_name, parse_version
from edge_core.protocol import packed
from edge_core.protocol.types import (
    SERVER_TIME,
    SERVER_US,
    InferRequest,
    InferResponse,
    RawAnswer,
)
from edge_core.status import status_of
from edge_core.tensors import check_rows, format_shape

__all__ = ["SERVER_NAME", "DataPlane"]

log = logging.getLogger(__name__)

SERVER_NAME = "edge-inference-gateway"
SERVER_VERSION = __version__
EXTENSIONS = [
    "binary_tensor_data",
    "model_repository",
    "schedule_policy",
    pictures.EXTENSION,
    packed.EXTENSION,
]
# A call ended this close to its deadline is counted as past it. gRPC's own timer ends
# a call at about the deadline computed from it here, but a client's timer starts
# before its request is sent: its cancel arrives ahead of the deadline seen here by
# the request's transit (measured 4 ms on an idle loopback; more on a loaded host).
CANCEL_SLACK_S = 0.05

Array = np.ndarray[Any, Any]
T = TypeVar("T")
R = TypeVar("R")


def _names(specs: dict[str, Any]) -> str:
    """The names a model takes, for an error message (built only when one is raised)."""
    return ", ".join(repr(n) for n in specs)


class DataPlane:
    def __init__(
        self,
        config: GatewayConfig,
        repository: ServingRepository,
        metrics: GatewayMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        remotes: Sequence[RemoteBackend] = (),
    ) -> None:
        self.config = config
        self.repository = repository
        self.remotes = tuple(remotes)
        self.metrics = metrics
        self._children: dict[tuple[Any, ...], Any] = {}  # metric children, see _child
        self._inference_cpus = config.inference_cpus
        self.executor = ThreadPoolExecutor(
            config.workers,
            thread_name_prefix="inference",
            initializer=None
            if config.inference_cpus is None
            else functools.partial(cpus.pin, config.inference_cpus),
        )
        self._clock = clock
        self._batchers: dict[int, DynamicBatcher] = {}  # id(LoadedModel) -> its batcher
        # pictures decoded at once at most (each up to PICTURE_PIXELS, some 36 MB decoded)
        self._decoding = asyncio.Semaphore(pictures.DECODING)
        self._ready = False
        self._stopping = False
        # one change of the loaded models at a time (polls, load and unload requests)
        self._changing: asyncio.Lock | None = None
        self._slots: BatchSlots | None = None

    # -- lifecycle (on the event loop) ----------------------------------------------

    def _change_lock(self) -> asyncio.Lock:
        if self._changing is None:
            self._changing = asyncio.Lock()
        return self._changing

    async def refresh(self, only: str | None = None) -> None:
        """Scan the repository (in a thread) and start or stop what serves the changes."""
        loop = asyncio.get_running_loop()
        async with self._change_lock():
            added, removed = await loop.run_in_executor(
                None, self._loading, self.repository.scan, only
            )
            await self._apply(added, removed)
        self._ready = True

    def _batch_slots(self) -> BatchSlots:
        """The batches out at once over every model: one more than the workers."""
        if self._slots is None:
            self._slots = BatchSlots(self.config.workers + 1)
        return self._slots

    def _loading(self, load: Callable[[T], R], argument: T) -> R:
        """Load models on the inference cores: a session's thread pool stays where it started."""
        with cpus.pinned(self._inference_cpus):
            return load(argument)

    async def apply(self, added: list[LoadedModel], removed: list[LoadedModel]) -> None:
        """Start serving ``added`` and stop ``removed`` (a remote engine's models)."""
        async with self._change_lock():
            await self._apply(added, removed)

    async def _apply(self, added: list[LoadedModel], removed: list[LoadedModel]) -> None:
        # stop first: a reloaded version has the same metric labels as the one it replaces
        for model in removed:
            await self._stop(model)
        for model in added:
            self._start(model)

    def _start(self, model: LoadedModel) -> None:
        package = model.package
        self.metrics.models_loaded.labels(package.name, str(package.version), model.variant).set(1)
        config = self.config.batching_for(package.name)
        if not (config.enabled and model.batchable) or model.forward is not None:
            return  # a remote engine's model: the engine batches
        name = package.qualified_name

        def on_batch(rows: int, waits: list[float], compute: float) -> None:
            self._child(self.metrics.batch_size, package.name).observe(rows)
            self._child(self.metrics.compute_seconds, package.name).observe(compute)
            queue = self._child(self.metrics.queue_seconds, package.name)
            for wait in waits:
                queue.observe(wait)

        self._batchers[id(model)] = DynamicBatcher(
            model.run,
            config,
            self.executor,
            name=name,
            on_batch=on_batch,
            clock=self._clock,
            # one batch waits in the executor while each worker runs one, whichever
            # model it is for: a worker that finishes starts the next batch at once,
            # not after a trip through the busy loop
            slots=self._batch_slots(),
        )

    async def _stop(self, model: LoadedModel) -> None:
        """Stop serving ``model``; its queued requests run first. The session itself is
        left to the garbage collector: a request already running on it finishes."""
        package = model.package
        with contextlib.suppress(KeyError):  # never started
            self.metrics.models_loaded.remove(package.name, str(package.version), model.variant)
        batcher = self._batchers.pop(id(model), None)
        if batcher is not None:
            await batcher.close()

    async def load(self, name: str) -> None:
        """Raises: BadRequest (a malformed name), NotFound, Unavailable."""
        check_model_name(name)
        loop = asyncio.get_running_loop()
        async with self._change_lock():
            added, removed = await loop.run_in_executor(
                None, self._loading, self.repository.load, name
            )
            await self._apply(added, removed)

    async def unload(self, name: str) -> None:
        """Raises: BadRequest (a malformed name), NotFound."""
        check_model_name(name)
        async with self._change_lock():
            for model in self.repository.unload(name):
                await self._stop(model)

    async def close(self) -> None:
        self._stopping = True
        for key in list(self._batchers):
            await self._batchers.pop(key).close()
        self.executor.shutdown(wait=True)

    def clock(self) -> float:
        """Now, on the clock deadlines are kept on."""
        return self._clock()

    # -- health and metadata ----------------------------------------------------------

    def live(self) -> bool:
        return not self._stopping

    def ready(self) -> bool:
        return self.not_ready() is None

    def not_ready(self) -> str | None:
        """Why the gateway is not ready (``None``: it is)."""
        if self._stopping:
            return "the gateway is stopping"
        if not self._ready:
            return "the gateway is loading its models"
        down = [f"engine {r.name} is down ({r.reason})" for r in self.remotes if not r.up]
        return "; ".join(down) or None

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS}

    def repository_index(self, *, admin: bool) -> list[dict[str, Any]]:
        """The repository's index; for a device (not ``admin``), without the reasons a
        version is unavailable (an operator's business: paths, an engine's address)."""
        index = self.repository.index()
        if admin:
            return index
        return [{k: v for k, v in entry.items() if k != "reason"} for entry in index]

    def _model(self, name: str, version: str) -> LoadedModel:
        """The loaded model a request names; the name and the version are checked
        before anything is looked up with them.

        Raises:
            BadRequest: not a model name, or not a version.
            NotFound: no such model or version is loaded.
        """
        return self.repository.get(check_model_name(name), parse_version(version))

    def label(self, name: str) -> str:
        """``name`` as a metric label: a loaded model's name, else ``unknown`` (clients
        choose the names: each one would be a new series)."""
        return name if is_model_name(name) and self.repository.versions(name) else "unknown"

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        """Raises: BadRequest (a malformed name or version), NotFound."""
        model = self._model(name, version)
        return {
            "name": name,
            "versions": [str(v) for v in self.repository.versions(name)],
            "platform": model.platform,
            "inputs": [spec.to_dict() for spec in model.inputs],
            "outputs": [spec.to_dict() for spec in model.outputs],
        }

    def model_ready(self, name: str, version: str = "") -> bool:
        """Raises: BadRequest (a malformed name or version), NotFound."""
        return self._model(name, version).is_ready() and not self._stopping

    # -- requests ------------------------------------------------------------------------

    def count_failure(self, model: str, protocol: str, exc: BaseException) -> None:
        """Count a request refused before it reached :meth:`infer` (auth, limits, a bad body)."""
        self._count(self.label(model), protocol, status_of(exc).kind)

    def _count(self, label: str, protocol: str, kind: str) -> None:
        """One failed request, in both series (every request, and the failures)."""
        self.metrics.requests.labels(label, protocol, kind).inc()
        self.metrics.failures.labels(label, protocol, kind).inc()

    def _feed(self, model: LoadedModel, request: InferRequest) -> dict[str, Array]:
        if model.forward is not None and not model.inputs:
            return request.inputs  # an engine that declares no inputs checks them itself
        expected = {spec.name: spec for spec in model.inputs}
        for name in expected:
            if name not in request.inputs:
                raise BadRequest(
                    f"missing input {name!r} for model {model.package.name!r} "
                    f"(it takes {_names(expected)})"
                )
        feed: dict[str, Array] = {}
        for name, array in request.inputs.items():
            spec = expected.get(name)
            if spec is None:
                raise BadRequest(
                    f"unknown input {name!r} for model {model.package.name!r} "
                    f"(it takes {_names(expected)})"
                )
            datatype = request.datatypes[name]
            if datatype != spec.datatype:
                raise BadRequest(f"input {name!r}: datatype {datatype}, expected {spec.datatype}")
            if not spec.accepts_shape(array.shape):
                raise BadRequest(
                    f"input {name!r}: shape {format_shape(array.shape)}, expected "
                    f"{format_shape(spec.shape)}"
                )
            feed[name] = array
        if model.batchable:
            if len({a.shape[0] for a in feed.values()}) > 1:
                raise BadRequest("all inputs must have the same batch size")
            name = model.package.name
            limit = self.config.batching_for(name).max_batch_size
            shapes = {key: array.shape for key, array in feed.items()}
            check_rows(model.inputs, shapes, limit, f"{name}'s max_batch_size")
        pre = model.package.preprocessing
        if pre is not None and pre.input in feed:
            pre.check_input(feed[pre.input].shape)  # a free-size picture: at most its pixels
        return feed

    def _deadline(self, request: InferRequest, deadline: float | None, now: float) -> float | None:
        """The front end's ``deadline``, shortened by the request's own ``timeout``.

        Raises:
            DeadlineExceeded: it had passed at ``now``, when the request arrived.
        """
        timeout_us = request.timeout_us
        if timeout_us:
            own = now + timeout_us / 1e6
            deadline = own if deadline is None else min(deadline, own)
        if deadline is not None and deadline <= now:
            raise DeadlineExceeded("the request's deadline had passed when it arrived")
        return deadline

    async def infer(
        self,
        request: InferRequest,
        *,
        device: Device | None,
        protocol: str,
        deadline: float | None = None,
        request_id: str | None = None,
    ) -> InferResponse:
        """Run one request.

        ``deadline`` is on this data plane's clock (the front end's own
        deadline, e.g. gRPC's); the request's ``timeout`` parameter can only
        shorten it. ``request_id`` is the caller's ``x-request-id`` (the agent
        sends the id its application gave it): failures are logged with it.

        Raises:
            RequestError or EdgeError: mapped to a status by the front end.
        """
        started = self._clock()
        model_label: str | None = None
        try:
            model = self._model(request.model_name, request.model_version)
            model_label = model.package.name
            deadline = self._deadline(request, deadline, started)  # before any work
            request = await self._unwire(model, request)
            feed = self._feed(model, request)
            wanted = None if request.outputs is None else self._wanted(model, request)
            if device is not None:
                self._child(self.metrics.device_requests, device.id, device.group).inc()
            raw = None
            if model.forward is not None:
                answer = await self._forward(model, request, deadline)
                outputs = answer.outputs
                raw = self._relayable(answer, model, request)
            else:
                outputs = await self._run(model, feed, deadline)
            if (wanted is not None and list(outputs) != wanted) or _asks_form(request):
                outputs = {name: outputs[name] for name in wanted or outputs}
                raw = None  # an answer in a form the device asked for is written here
            response = InferResponse(
                model_name=model.package.name,
                model_version=str(model.package.version),
                outputs=outputs,
                id=request.id,
                raw=raw,
            )
            await self._wire(request, response, started, protocol)
        except asyncio.CancelledError:
            self._count_cancelled(model_label or self.label(request.model_name), protocol, deadline)
            raise
        except Exception as exc:
            self._count_failed(
                model_label or self.label(request.model_name), protocol, exc, request_id
            )
            raise
        self._child(self.metrics.requests, model_label, protocol, "ok").inc()
        self._child(self.metrics.request_seconds, model_label, protocol).observe(
            self._clock() - started
        )
        return response

    async def _unwire(self, model: LoadedModel, request: InferRequest) -> InferRequest:
        """The request as its model takes it: packed tensors unpacked (within the body
        limit), image files for a picture input made its tensor as the manifest says.

        Raises:
            InputError, PayloadTooLarge: a packed tensor or a picture is malformed or too
                large.
        """
        descriptor = request.parameters.get(packed.PARAMETER)
        if descriptor is not None:  # zlib's work, off the event loop
            inputs, datatypes = await asyncio.get_running_loop().run_in_executor(
                None,
                functools.partial(
                    packed.unpack,
                    request.inputs,
                    request.datatypes,
                    descriptor,
                    max_bytes=self.config.max_body_bytes,
                ),
            )
            request = replace(request, inputs=inputs, datatypes=datatypes, raw=None)
        spec = pictures.picture_spec(model.package, model.inputs, request)
        if spec is not None:
            rows = self.config.batching_for(model.package.name).max_batch_size
            async with self._decoding:
                request = await pictures.decode_pictures(model.package, spec, request, rows)
        return request

    async def _wire(
        self, request: InferRequest, response: InferResponse, started: float, protocol: str
    ) -> None:
        """What a device asked of the answer's form: its outputs packed (``edge_compress``;
        only outputs sent as binary data: a packed stream is no JSON value), the time the
        request spent here (``edge_server_time``, in microseconds)."""
        asked = request.parameters
        if asked.get(packed.ASK) is True and _binary_outputs(request, protocol):
            loop = asyncio.get_running_loop()  # zlib's work, off the event loop
            outputs, _, descriptor = await loop.run_in_executor(None, packed.pack, response.outputs)
            if descriptor is not None:
                response.outputs = outputs
                response.parameters[packed.PARAMETER] = descriptor
        if asked.get(SERVER_TIME) is True:
            response.parameters[SERVER_US] = int((self._clock() - started) * 1e6)

    @staticmethod
    def _wanted(model: LoadedModel, request: InferRequest) -> list[str]:
        """The outputs a request names, each one of the model's.

        Raises:
            BadRequest: an output the model does not have.
        """
        known = {spec.name for spec in model.outputs}
        wanted = [o.name for o in request.outputs or ()]
        for name in wanted:
            if name not in known:
                raise BadRequest(f"unknown output {name!r} for model {model.package.name!r}")
        return wanted

    def _count_cancelled(self, label: str, protocol: str, deadline: float | None) -> None:
        """A request the front end gave up on (gRPC ends a call at its deadline, or when
        the client cancels): counted all the same, under what ended it."""
        late = deadline is not None and self._clock() >= deadline - CANCEL_SLACK_S
        self._count(label, protocol, "deadline_exceeded" if late else "cancelled")

    def _count_failed(
        self, label: str, protocol: str, exc: Exception, request_id: str | None
    ) -> None:
        """A request that failed, counted by its status's kind; logged when the fault is
        the gateway's (a 5xx), with the caller's request id."""
        status = status_of(exc)
        self._count(label, protocol, status.kind)
        if status.http >= 500:
            log.error(
                "request %s for %s failed: %s",
                request_id or "-",
                label,
                exc,
                extra={"request_id": request_id},
            )

    def _child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, kept: prometheus_client's lookup takes a lock and
        checks every label each time, several times a request. These series are never
        removed, and their labels are bounded (models, protocols, devices)."""
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    @staticmethod
    def _relayable(
        answer: InferResponse, model: LoadedModel, request: InferRequest
    ) -> RawAnswer | None:
        """The engine's answer body, when it says what this gateway's own would: the
        same model, version and id (the front end checks that its outputs are in the
        form the client asked)."""
        if answer.raw is None:
            return None
        if (answer.model_name, answer.model_version, answer.id) != (
            model.package.name,
            str(model.package.version),
            request.id,
        ):
            return None
        return answer.raw

    async def _forward(
        self, model: LoadedModel, request: InferRequest, deadline: float | None
    ) -> InferResponse:
        """A remote engine's model: the request as it came, on the loop, no batcher."""
        assert model.forward is not None
        started = self._clock()
        answer = await model.forward(request, deadline)
        self._child(self.metrics.compute_seconds, model.package.name).observe(
            self._clock() - started
        )
        missing = [o.name for o in request.outputs or () if o.name not in answer.outputs]
        if missing:
            raise EngineError(f"engine {model.device} left out output(s) {', '.join(missing)}")
        return answer

    async def _run(
        self, model: LoadedModel, feed: dict[str, Array], deadline: float | None
    ) -> dict[str, Array]:
        batcher = self._batchers.get(id(model))
        if batcher is not None:
            return await batcher.submit(feed, deadline)
        loop = asyncio.get_running_loop()
        started = self._clock()
        future = loop.run_in_executor(self.executor, model.run, feed)
        try:
            if deadline is None:
                outputs = await future
            else:
                outputs = await asyncio.wait_for(future, max(deadline - started, 0.0))
        except asyncio.TimeoutError:
            raise DeadlineExceeded(
                f"the request's deadline passed while model {model.package.name} ran"
            ) from None
        name = model.package.name
        self._child(self.metrics.compute_seconds, name).observe(self._clock() - started)
        self._child(self.metrics.batch_size, name).observe(
            next(iter(feed.values())).shape[0] if feed else 1
        )
        return outputs


def _asks_form(request: InferRequest) -> bool:
    """Whether a device asked for its answer in a form of this gateway's own (packed
    outputs, the time spent here), which an engine's answer relayed as it is lacks."""
    parameters = request.parameters
    return parameters.get(packed.ASK) is True or parameters.get(SERVER_TIME) is True


def _binary_outputs(request: InferRequest, protocol: str) -> bool:
    """Whether every output of the answer goes as binary data (gRPC's always do)."""
    if protocol == "grpc":
        return True
    if request.outputs is None:
        return request.binary_output
    return all(
        o.binary_data if o.binary_data is not None else request.binary_output
        for o in request.outputs
    )
