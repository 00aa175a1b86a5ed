"""The offload client: everything between the agent and a transport.

- Before anything leaves: a model the device does not hold is looked up in the
  :class:`CloudCatalog` (the cloud lacks it: refused here; its inputs: the request
  must fit them), and the request takes its smallest form on the wire
  (:func:`~edge_agent.offload.wire.wire_form`: pictures encoded, other tensors
  packed, each only for a gateway that lists the extension; a picture's quality
  steps down when the link's estimate says it would miss the deadline).
- Privacy: the request *as it leaves* is checked by the :class:`ExitGuard` (a
  redacted picture is searched again as encoded; without a guard given, one with the
  default rules and no face detector: it refuses any picture it cannot search); its
  refusals do not count against the link.
- Deadlines: each attempt gets what is left of the request's deadline; none
  starts after it.
- Retries: only when the gateway was unavailable (connection refused,
  UNAVAILABLE, 503), at most ``retries`` times, after a jittered, doubling
  pause that also fits the deadline. A timeout or a refusal is not retried.
- Circuit breaker: unavailability and timeouts count as failures (a timeout
  only when the attempt had at least ``min_budget_s``: a deadline too short for
  any gateway says nothing about the link); an open breaker refuses at once
  (:class:`BreakerOpen`), so a dead link costs nothing. Whatever a transport
  raises, the breaker hears of it: it never stays half-open on an error.
- What it learns (:class:`OffloadCosts`): each answered request's bytes each way
  and its time, and the gateway's share of it (``edge_server_time``): the link's
  round trip and bandwidth, and per model its bytes and the gateway's time, which
  price the next request (:meth:`OffloadClient.estimate`). A refusal as *not found*
  tells the catalog the cloud lacks the model.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from edge_agent.offload.base import Transport
from edge_agent.offload.breaker import CircuitBreaker
from edge_agent.offload.catalog import CloudCatalog
from edge_agent.offload.costs import CloudEstimate, OffloadCosts
from edge_agent.offload.guard import ExitGuard
from edge_agent.offload.link import SMALL_BYTES
from edge_agent.offload.wire import WireForm, packed_form, round_trip, wire_form
from edge_agent.policy.rules import PolicyRules
from edge_agent.privacy import PrivacyInspector
from edge_core.errors import (
    BreakerOpen,
    EdgeError,
    InputError,
    ModelNotFoundError,
    OffloadRejected,
    OffloadTimeout,
    OffloadUnavailable,
)
from edge_core.package import ModelPackage
from edge_core.pictures import EXTENSION as PICTURES
from edge_core.protocol import packed
from edge_core.protocol.types import SERVER_TIME, SERVER_US, InferRequest, InferResponse
from edge_core.tensors import TensorSpec, convert_input, format_shape

__all__ = ["MAX_ANSWER_BYTES", "OffloadClient", "fitted"]

NOT_FOUND = frozenset({"404", "NOT_FOUND"})
Array = np.ndarray[Any, Any]
# an answer's packed outputs, unpacked, at most (the gateway's own body limit)
MAX_ANSWER_BYTES = 64 * 1024 * 1024
LOOKUP_SHARE = 0.25  # of the time left, for a question to the catalog


class OffloadClient:
    def __init__(
        self,
        transport: Transport,
        *,
        guard: ExitGuard | None = None,
        breaker: CircuitBreaker | None = None,
        retries: int = 2,
        backoff_s: float = 0.02,
        min_budget_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.transport = transport
        self.guard = guard or ExitGuard(PrivacyInspector(None), PolicyRules())
        self.breaker = breaker or CircuitBreaker(clock=clock)
        self.retries = retries
        self.backoff_s = backoff_s
        self.min_budget_s = min_budget_s
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.attempts = 0
        self.retried = 0
        self.costs = OffloadCosts(clock=clock)
        asks = transport.asks_the_gateway
        self.catalog = CloudCatalog(
            transport,
            clock=clock,
            on_exchange=(lambda s: self.costs.link.observe(SMALL_BYTES, s, 0.0)) if asks else _no,
        )

    @property
    def rules(self) -> PolicyRules:
        return self.guard.rules

    def _budget(self, deadline: float) -> float:
        """The time a question to the catalog may take of what is left."""
        return (deadline - self._clock()) * LOOKUP_SHARE

    def estimate(self, model: str, raw_bytes: int, *, picture: bool) -> CloudEstimate | None:
        """What an offload of ``model`` with ``raw_bytes`` of tensors is expected to take
        (``picture``: it holds a picture that leaves encoded where the gateway takes it)."""
        encoded = (
            picture
            and self.rules.picture_format != "tensor"
            and PICTURES in self.catalog.known_extensions()
        )
        return self.costs.estimate(model, raw_bytes, picture=encoded)

    def picture_view(
        self, package: ModelPackage | None, deadline: float
    ) -> Callable[[Array], Array] | None:
        """What a picture for ``package``'s model becomes on its way to the gateway, at
        the policy's quality (:func:`~edge_agent.offload.wire.round_trip`), where it will
        leave encoded; ``None`` where it leaves as it is. What redaction checks."""
        pre = package.preprocessing if package is not None else None
        if pre is None:
            return None
        if PICTURES not in self.catalog.extensions(timeout=self._budget(deadline)):
            return None
        return round_trip(pre, self.rules.picture_format, self.rules.picture_quality)

    def infer(
        self,
        request: InferRequest,
        *,
        deadline: float,
        label: str | None = None,
        redacted: bool = False,
        request_id: str | None = None,
        package: ModelPackage | None = None,
    ) -> InferResponse:
        """Send ``request``; ``deadline`` is on this client's clock. ``package``: the
        model's package where the device holds it (its preprocessing says how a
        picture leaves); without one, the request is checked against the cloud's
        metadata of the model first.

        Raises:
            OffloadRejected: the cloud does not have the model (status 404), or refused it.
            InputError: the request does not fit the cloud's model.
            PrivacyRefusal: the exit guard refused the data.
            BreakerOpen: the breaker is open.
            OffloadTimeout: the deadline passed.
            OffloadUnavailable: the gateway stayed unreachable through the retries.
            OffloadRejected: the gateway answered with an error.
        """
        request_id = request_id or uuid.uuid4().hex
        if package is None:
            request = self._fit_the_cloud(request, deadline)
        # a redacted picture leaves at the quality its redaction was checked at
        form = self._wire_form(request, package, deadline, step_down=not redacted)
        # checked as it leaves: its pictures as encoded; packing, after, changes no byte
        pre = package.preprocessing if package is not None else None
        self.guard.check(form.request, label=label, redacted=redacted, preprocessing=pre)
        outgoing = packed_form(form.request, form.extensions)
        outgoing = replace(outgoing, parameters={**outgoing.parameters, SERVER_TIME: True})
        if not self.breaker.allow():
            raise BreakerOpen("the circuit breaker is open: the gateway failed repeatedly")
        response, seconds = self._send(outgoing, deadline, request_id)
        self._learn(request, form, response, seconds)
        return self._unpacked(response)

    def _fit_the_cloud(self, request: InferRequest, deadline: float) -> InferRequest:
        """Refuse, before anything leaves, a request for a model the cloud lacks, or
        that does not fit what the cloud says the model takes; cast it where it
        safely can."""
        model = request.model_name
        try:
            found = self.catalog.metadata(model, timeout=self._budget(deadline))
        except ModelNotFoundError:  # the gateway's verdict, as its 404 would have said it
            raise OffloadRejected(
                f"{model} is not on this device and the cloud does not have it", status="404"
            ) from None
        if found is None or not found.inputs or request.model_version:
            return request  # a version the metadata does not describe: the gateway checks
        return fitted(found.inputs, request, model)

    def _wire_form(
        self,
        request: InferRequest,
        package: ModelPackage | None,
        deadline: float,
        *,
        step_down: bool = True,
    ) -> WireForm:
        rules = self.rules
        extensions = self.catalog.extensions(timeout=self._budget(deadline))
        model = request.model_name

        def fits(nbytes: int) -> bool:
            left_ms = (deadline - self._clock()) * 1000 - rules.deadline_margin_ms
            if not step_down or left_ms <= 0:  # no other quality, or no time to make one
                return True
            estimate = self.costs.estimate_bytes(model, nbytes, self.costs.expected_down(model))
            return estimate is None or estimate.total_ms <= left_ms

        return wire_form(
            request,
            package,
            extensions,
            picture_format=rules.picture_format,
            quality=rules.picture_quality,
            fits=fits,
        )

    def _send(
        self, request: InferRequest, deadline: float, request_id: str
    ) -> tuple[InferResponse, float]:
        """The transport's answer, with retries, within the deadline, through the breaker,
        and the time the answered attempt took (not the pauses and failed tries before)."""
        attempt = 0
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0:
                self.breaker.release()  # nothing was sent: nothing learnt about the link
                raise OffloadTimeout("the deadline passed before the request could be sent")
            self.attempts += 1
            sent = self._clock()
            try:
                response = self.transport.infer(request, timeout=remaining, request_id=request_id)
            except OffloadUnavailable:
                pause = self.backoff_s * (2**attempt) * self._rng.uniform(0.5, 1.5)
                if attempt >= self.retries or self._clock() + pause >= deadline:
                    self.breaker.failure()
                    raise
                attempt += 1
                self.retried += 1
                self._sleep(pause)
                continue
            except OffloadTimeout:
                if remaining >= self.min_budget_s:
                    self.breaker.failure()
                else:
                    self.breaker.release()
                raise
            except OffloadRejected as exc:
                self.breaker.success()  # the link works; the request was wrong
                if exc.status in NOT_FOUND and not request.model_version:
                    self.catalog.missing(request.model_name)  # not just a version it lacks
                raise
            except Exception as exc:  # a transport's own bug or a closed channel
                self.breaker.failure()
                raise OffloadUnavailable(
                    f"the {self.transport.name} transport failed: {exc!r}"
                ) from exc
            self.breaker.success()
            return response, self._clock() - sent

    def _learn(
        self, request: InferRequest, form: WireForm, response: InferResponse, elapsed: float
    ) -> None:
        """What an answered request says of the link and of the model."""
        extensions = self.transport.learnt_extensions()
        if extensions is not None:  # MQTT: the answers name them
            self.catalog.learn_extensions(extensions)
        if response.wire_bytes is None:
            return
        model = request.model_name
        up, down = response.wire_bytes
        server_us = response.parameters.pop(SERVER_US, None)
        server_s = server_us / 1e6 if isinstance(server_us, int) else None
        self.costs.observe(
            model,
            raw_bytes=form.raw_bytes,
            sent=up,
            received=down,
            total_s=elapsed,
            server_s=server_s,
        )

    @staticmethod
    def _unpacked(response: InferResponse) -> InferResponse:
        descriptor = response.parameters.pop(packed.PARAMETER, None)
        if descriptor is None:
            return response
        try:
            outputs, _ = packed.unpack(
                response.outputs,
                dict.fromkeys(response.outputs, "BYTES"),
                descriptor,
                max_bytes=MAX_ANSWER_BYTES,
            )
        except EdgeError as exc:  # malformed, or more than this device unpacks
            raise OffloadRejected(f"malformed packed answer: {exc}") from exc
        return replace(response, outputs=outputs)

    def traffic_report(self) -> dict[str, dict[str, int]]:
        """Bytes sent and received, and offloads answered, per model."""
        return self.costs.traffic()

    def close(self) -> None:
        self.transport.close()


def _no(seconds: float) -> None:
    """What a transport that asks the gateway nothing learns from its questions."""


def fitted(specs: tuple[TensorSpec, ...], request: InferRequest, model: str) -> InferRequest:
    """``request`` checked against ``specs`` as the gateway would check it (names,
    shapes), its tensors cast to the datatypes the model takes where that is safe
    (image files are the gateway's to judge).

    Raises:
        InputError: an input is missing, unknown, of the wrong shape, or of a datatype
            that cannot be cast safely; the message names it and what was expected.
    """
    expected = {spec.name: spec for spec in specs}
    takes = ", ".join(repr(name) for name in expected)
    for name in expected:
        if name not in request.inputs:
            raise InputError(f"missing input {name!r} for model {model!r} (it takes {takes})")
    inputs, datatypes = dict(request.inputs), dict(request.datatypes)
    for name, array in request.inputs.items():
        spec = expected.get(name)
        if spec is None:
            raise InputError(f"unknown input {name!r} for model {model!r} (it takes {takes})")
        if array.dtype == object:
            continue
        if not spec.accepts_shape(array.shape):
            raise InputError(
                f"input {name!r}: shape {format_shape(array.shape)}, expected "
                f"{format_shape(spec.shape)}"
            )
        inputs[name], datatypes[name] = convert_input(spec, array), spec.datatype
    return replace(request, inputs=inputs, datatypes=datatypes)
