"""One stream: decode → preprocess → infer → postprocess, each stage on a thread of its
own, so that the slowest sets the pace and the others overlap it (while frame t is
inferred, frame t+1 is decoded and preprocessed, frame t-1's result written).

::

    capture ──▶ [newest] ──▶ prepare ──▶ [newest] ──▶ infer ──▶ [2] ──▶ emit ──▶ sink
    (decode,                 (key frame?               (through the       (describe,
     pace)                    preprocess)               agent: policy,     result, sink)
                                                        offload, fallback)

Before each of the two stages that may be slower than the camera there is one slot
(:class:`~.rules.LatestSlot`) that keeps the newest item: when inference (or
preprocessing) is slower than the camera, old frames are dropped, not queued, and
counted, and the frame inference takes next is the freshest there is (a queue of
frames would only add latency: each waiting frame is one inference older). A file read
as fast as it decodes (``realtime = false``) waits for the pipeline instead, and every
frame gets its result. After inference a short queue: a frame inferred is never
dropped, and results come out in the frames' order.

Every frame goes through :meth:`Agent.infer`: the policy decides per frame (a
``personal`` stream that offloads sends redacted frames, a ``sensitive`` one stays on
the device), with the agent's fallback when the cloud fails (degraded results, no
stall). A frame the agent refuses or fails gives a result with its ``error``.

A result (a dict, JSON as it is) carries the stream, the frame's index and capture
time, the end-to-end latency (capture to result), each stage's time, the decision, and
what the model answered (:func:`edge_agent.results.describe_outputs`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from edge_agent.agent.stats import LatencyWindow
from edge_agent.config import StreamSettings
from edge_agent.results import describe_outputs
from edge_agent.streams.rules import LatestSlot, key_frame, thumbnail
from edge_agent.streams.source import Capture, Frame, Source
from edge_core.errors import EdgeError, InputError
from edge_core.images import MAX_IMAGE_PIXELS
from edge_core.package import ModelPackage
from edge_core.pictures import image_to_tensor
from edge_core.status import status_of

__all__ = ["Capture", "Frame", "Infer", "Stream", "StreamStats"]

log = logging.getLogger(__name__)

Array = np.ndarray[Any, Any]
STAGES = ("decode", "preprocess", "infer", "postprocess")
_END = object()  # what closes a queue


@dataclass
class Prepared:
    """A frame ready for inference: its thumbnail (key frames), its input tensor (``None``
    when it looked like the last frame inferred), or why it could not be prepared."""

    frame: Frame
    small: Array | None = None
    tensor: Array | None = None
    error: Exception | None = None


class Infer(Protocol):
    """The agent's ``infer`` (the stream's seam)."""

    def __call__(
        self, model: str, inputs: dict[str, Array], *, label: str | None, deadline_ms: float | None
    ) -> Any: ...


class StreamStats:
    """A stream's counters and latencies, thread-safe; names are from a bounded set."""

    OUTCOMES = ("in", "out", "dropped", "skipped", "failed", "degraded", "unsent")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts = dict.fromkeys(self.OUTCOMES, 0)
        self.latency = LatencyWindow(512)  # "end_to_end" and each stage, in ms
        self.state = "starting"  # the source's: one of source.STATES
        self.reopened = 0  # times a live source was opened again
        self.offloaded = [0, 0, 0]  # frames answered by the cloud, bytes sent, bytes received

    def count(self, outcome: str, n: int = 1) -> None:
        with self._lock:
            self.counts[outcome] += n

    def count_bytes(self, sent: int, received: int) -> None:
        """One frame answered by the cloud, and the bytes its offload took each way."""
        with self._lock:
            self.offloaded[0] += 1
            self.offloaded[1] += sent
            self.offloaded[2] += received

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            counts = dict(self.counts)
            frames, sent, received = self.offloaded
        return {
            "frames": counts,
            "latency_ms": self.latency.summary(),
            "state": self.state,
            "reopened": self.reopened,
            "offloaded": {
                "frames": frames,
                "bytes_sent": sent,
                "bytes_received": received,
                "bytes_a_frame": round((sent + received) / frames) if frames else None,
            },
        }


class Stream:
    """Runs one ``[[streams]]`` entry until its source ends or :meth:`stop`.

    A frame that fails in a stage (a model that raises, outputs nothing reads) gives a
    result with its ``error`` and counts as ``failed``; the stream goes on. The stages
    hand their end down the line whatever happens, so :meth:`join` always returns.
    """

    def __init__(
        self,
        settings: StreamSettings,
        package: ModelPackage,
        *,
        open_capture: Callable[[], Capture],
        infer: Infer,
        emit: Callable[[dict[str, Any]], None],
        packages: Callable[[str], ModelPackage | None] = lambda name: None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        max_pixels: int = MAX_IMAGE_PIXELS,
    ) -> None:
        """``package``: the model's (its image preprocessing makes a frame its input);
        ``packages``: the package of another model that answered (the cloud's, a
        stand-in), to read its outputs; ``max_pixels``: a frame's at most.

        Raises:
            InputError: the model takes no pictures (no image preprocessing).
        """
        if package.preprocessing is None:
            raise InputError(
                f"stream {settings.name}: model {package.name} takes no pictures (its manifest "
                "has no image preprocessing)"
            )
        self.settings = settings
        self.package = package
        self.stats = StreamStats()
        self._infer = infer
        self._emit = emit
        self._packages = packages
        self._clock = clock
        self._stop = threading.Event()
        self.source = Source(settings, open_capture, stop=self._stop, clock=clock, wall=wall,
                             on_state=self._on_state, max_pixels=max_pixels)  # fmt: skip
        self._slot: LatestSlot[Frame] = LatestSlot()
        self._prepared: LatestSlot[Prepared] = LatestSlot()
        # a camera (or a file in real time) cannot wait: the newest frame wins; a file read
        # as fast as it decodes waits for the pipeline, and loses no frame
        self._lossless = not self.source.live and not settings.realtime
        self._answered: queue.Queue[Any] = queue.Queue(maxsize=2)
        self._threads: list[threading.Thread] = []
        self._last_key: Array | None = None  # the thumbnail of the last frame inferred
        self._last_outcome: Any = None  # and its result, for the frames skipped after it
        self._quiet: set[str] = set()  # what went wrong and was said (once a spell)
        self.finished = threading.Event()  # the source ended, or the stream was stopped

    @property
    def error(self) -> str | None:
        """Why the stream's file could not be read (``None``: it could, or is live)."""
        return self.source.error

    # -- life -------------------------------------------------------------------------

    def start(self) -> None:
        for target, stage in (
            (self._capture_loop, "capture"),
            (self._prepare_loop, "prepare"),
            (self._infer_loop, "infer"),
            (self._emit_loop, "emit"),
        ):
            thread = threading.Thread(
                target=target, name=f"stream-{self.settings.name}-{stage}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def request_stop(self) -> None:
        """Take no more frames (those taken finish: see :meth:`join`)."""
        self._stop.set()

    def stop(self, drain_s: float = 5.0) -> bool:
        """Take no more frames; let those taken finish within ``drain_s``. Whether they did."""
        self.request_stop()
        return self.finished.wait(drain_s)

    def join(self, timeout: float | None = None) -> bool:
        return self.finished.wait(timeout)

    def _on_state(self, state: str) -> None:
        self.stats.state = state
        self.stats.reopened = self.source.reopened

    # -- the stages: each hands its end down the line, whatever happens ---------------

    def _capture_loop(self) -> None:
        """Decode frames and leave each in the slot (the newest wins), at the stream's
        pace."""
        try:
            for frame in self.source.frames():
                self.stats.count("in")
                if self._slot.put(frame, wait=self._lossless):
                    self.stats.count("dropped")
                if self._slot.abandoned:  # nobody takes them any more
                    break
        except Exception:
            log.exception("stream %s: the capture failed", self.settings.name)
            self.stats.state = "failed"
        finally:
            self._slot.close()

    def _prepare_loop(self) -> None:
        try:
            while (frame := self._next(self._slot)) is not None:
                if self._prepared.put(self._prepare(frame), wait=self._lossless):
                    self.stats.count("dropped")  # inference is slower: the newer frame wins
        finally:
            self._slot.abandon()  # a capture waiting to hand a frame over goes on
            self._prepared.close()

    def _infer_loop(self) -> None:
        try:
            while (item := self._next(self._prepared)) is not None:
                self._answered.put((item.frame, *self._answer(item)))
        finally:
            self._prepared.abandon()
            self._answered.put(_END)

    def _emit_loop(self) -> None:
        try:
            while (item := self._answered.get()) is not _END:
                try:
                    self._finish(*item)
                except Exception:  # a bug of ours: this result is lost, not the stream
                    log.exception("stream %s: a result was lost", self.settings.name)
        finally:
            self.finished.set()

    @staticmethod
    def _next(slot: LatestSlot[Any]) -> Any:
        """The next item of ``slot``, or ``None`` once it is closed and empty."""
        while True:
            item = slot.take(timeout=0.5)
            if item is not None or slot.done:
                return item

    def run_in_turn(self) -> None:
        """The same stages one after the other on the calling thread, frame by frame,
        until the source ends or :meth:`stop`: what a single core does best, and what
        the benchmark compares the pipeline with."""
        try:
            for frame in self.source.frames():
                self.stats.count("in")
                self._finish(frame, *self._answer(self._prepare(frame)))
        finally:
            self.finished.set()

    # -- one frame, stage by stage ------------------------------------------------------

    def _prepare(self, frame: Frame) -> Prepared:
        """The frame's thumbnail (with key frames) and the manifest's preprocessing, left
        out for a frame like the last one inferred (inference would skip it)."""
        pre = self.package.preprocessing
        assert pre is not None
        started = self._clock()
        prepared = Prepared(frame)
        try:
            if self.settings.key_frames > 0:
                prepared.small = thumbnail(frame.pixels)
            if not self._like_the_last(prepared.small):
                prepared.tensor = image_to_tensor(frame.pixels, pre)
        except Exception as exc:  # a frame OpenCV decoded but cannot convert
            prepared.error = self._unexpected("preprocessing", exc)
        frame.stages["preprocess"] = (self._clock() - started) * 1000
        return prepared

    def _like_the_last(self, small: Array | None) -> bool:
        """Whether a frame of thumbnail ``small`` is like the last one inferred (key
        frames; the last one's result stands for it)."""
        if small is None or self._last_outcome is None:
            return False
        return not key_frame(self._last_key, small, self.settings.key_frames).key

    def _answer(self, item: Prepared) -> tuple[Any, bool]:
        """Through the agent (the policy, the offload, the fallback): its result, or the
        error that stands for it, and whether the frame was skipped (like the last one
        inferred, judged here, against the frame inference really took last: its result
        stands for this one)."""
        pre = self.package.preprocessing
        assert pre is not None
        started = self._clock()
        outcome: Any
        skipped = item.error is None and self._like_the_last(item.small)
        if item.error is not None:
            outcome = item.error
        elif skipped:
            outcome = self._last_outcome
        else:
            try:
                tensor = item.tensor
                if tensor is None:  # prepared against an older frame than the one taken last
                    tensor = image_to_tensor(item.frame.pixels, pre)
                outcome = self._infer(
                    self.package.name,
                    {pre.input: tensor},
                    label=self.settings.label,
                    deadline_ms=self.settings.deadline_ms or None,
                )
                self._last_key, self._last_outcome = item.small, outcome
            except EdgeError as exc:  # refused, or the cloud failed with no stand-in
                outcome = exc
            except Exception as exc:  # a runtime that raised: this frame fails, not the stream
                outcome = self._unexpected("inference", exc)
        item.frame.stages["infer"] = (self._clock() - started) * 1000
        return outcome, skipped

    def _finish(self, frame: Frame, outcome: Any, skipped: bool) -> None:
        """Describe the answer, time the frame, count it, and give it to the sink."""
        started = self._clock()
        try:
            result = self._result(frame, outcome, skipped)
        except Exception as exc:  # outputs that nothing reads as the manifest says
            result = self._result(frame, self._unexpected("reading the answer", exc), skipped)
        frame.stages["postprocess"] = (self._clock() - started) * 1000
        end_to_end = (self._clock() - frame.at) * 1000
        result["latency_ms"] = round(end_to_end, 3)
        result["stages_ms"] = {k: round(v, 3) for k, v in frame.stages.items()}
        self.stats.latency.observe("end_to_end", end_to_end)
        for stage in STAGES:
            if stage in frame.stages:
                self.stats.latency.observe(stage, frame.stages[stage])
        self.stats.count("out")
        if skipped:
            self.stats.count("skipped")
        try:
            self._emit(result)
        except BrokenPipeError:  # nobody reads any more (`edge-agent stream | head`)
            if not self._stop.is_set():
                log.info("stream %s: its reader went away; stopping", self.settings.name)
                self.request_stop()
            self.stats.count("unsent")
        except Exception as exc:  # a sink that fails loses this result, not the stream
            self.stats.count("unsent")
            self._say("sink", f"stream {self.settings.name}: the sink failed: {exc}")
        else:
            self._quiet.discard("sink")

    def _unexpected(self, stage: str, exc: Exception) -> EdgeError:
        """An error no stage expects, said once a spell, as the frame's error."""
        error = EdgeError(f"{stage} failed: {type(exc).__name__}: {exc}")
        self._say(stage, f"stream {self.settings.name}: {error}")
        return error

    def _say(self, what: str, message: str) -> None:
        level = logging.DEBUG if what in self._quiet else logging.WARNING
        self._quiet.add(what)
        log.log(level, "%s", message)

    def _result(self, frame: Frame, outcome: Any, skipped: bool) -> dict[str, Any]:
        result: dict[str, Any] = {
            "stream": self.settings.name,
            "frame": frame.index,
            "captured_at": frame.captured,
            "skipped": skipped,
        }
        if isinstance(outcome, BaseException):
            self.stats.count("failed")
            status = status_of(outcome)
            decision = getattr(outcome, "decision", None)
            result.update(error=status.message, status=status.http)
            if decision is not None:
                result.update(decision=decision.action.value, reason=decision.reason)
            return result
        package = self.package
        if outcome.model != package.name:  # the cloud's model, or a stand-in, answered
            package = self._packages(outcome.model) or package
        answer = describe_outputs(package, outcome.outputs, top=3, image_hw=frame.pixels.shape[:2])
        if outcome.degraded and not skipped:  # once an inference, not once a frame
            self.stats.count("degraded")
        if outcome.wire_bytes is not None and not skipped:
            self.stats.count_bytes(*outcome.wire_bytes)
        result.update(
            decision=outcome.decision.action.value,
            reason=outcome.decision.reason,
            where=outcome.where,
            model=outcome.model,
            version=outcome.version,
            degraded=outcome.degraded,
            answer=answer,
        )
        return result
