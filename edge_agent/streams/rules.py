"""The stream's rules, pure: which frames to drop, which to skip, how late a result is.

- **The newest frame wins** (:class:`LatestSlot`): between the camera and the rest of
  the pipeline there is one slot; a frame that arrives while the slot still holds an
  older one replaces it, and the older one is dropped and counted. A queue of frames
  would only add latency: a result about a frame half a second old is worth less than
  one about the frame that just came.
- **Key frames** (:func:`key_frame`): a frame too like the last one inferred (the mean
  absolute difference of two small grey thumbnails, 0..255, below a threshold) is
  skipped, and the last result carried over for it, counted as such.
- **Pacing** (:func:`next_due`): a stream with a rate takes a frame at most that often.

No I/O, no clock: times are passed in.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from edge_agent.extras import opencv

__all__ = ["THUMBNAIL", "LatestSlot", "key_frame", "next_due", "thumbnail"]

Array = np.ndarray[Any, Any]
T = TypeVar("T")

THUMBNAIL = (32, 24)  # width, height: enough to see a scene change, cheap to compare


class LatestSlot(Generic[T]):
    """One slot that keeps the newest item between a producer and a consumer thread.

    :meth:`put` replaces an item not yet taken (the newest wins), or, with ``wait``,
    waits until it is taken; :meth:`take` waits for one. The producer closes it
    (:meth:`close`) when it has no more; the consumer abandons it (:meth:`abandon`) when
    it will take no more, so that a producer waiting to hand an item over goes on.
    Thread-safe.
    """

    def __init__(self) -> None:
        self._item: T | None = None
        self._has = False
        self._closed = False
        self._abandoned = False
        self._cond = threading.Condition()

    def put(self, item: T, *, wait: bool = False) -> bool:
        """Leave ``item`` for the next :meth:`take`; ``True`` when an item was lost for it
        (an older one replaced, or this one, the consumer gone). With ``wait`` (a file
        read as fast as it decodes, where every frame counts), wait until the slot is
        free instead."""
        with self._cond:
            if wait:
                self._cond.wait_for(lambda: not self._has or self._closed or self._abandoned)
            if self._abandoned:
                return True
            replaced = self._has
            self._item, self._has = item, True
            self._cond.notify()
            return replaced

    def take(self, timeout: float | None = None) -> T | None:
        """The newest item (``None`` when closed and empty, or after ``timeout`` seconds)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._has or self._closed, timeout):
                return None
            if not self._has:
                return None
            item, self._item, self._has = self._item, None, False
            self._cond.notify_all()  # a waiting put may go on
            return item

    @property
    def done(self) -> bool:
        """Closed, and the last item taken."""
        with self._cond:
            return self._closed and not self._has

    @property
    def abandoned(self) -> bool:
        with self._cond:
            return self._abandoned

    def close(self) -> None:
        """No more items: a waiting :meth:`take` returns what is left, then ``None``."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def abandon(self) -> None:
        """No more takes: a waiting :meth:`put` returns, and every later one at once."""
        with self._cond:
            self._abandoned = True
            self._item, self._has = None, False
            self._cond.notify_all()


def thumbnail(frame: Array) -> Array:
    """A small grey copy of a BGR (or grey) frame, to compare frames by."""
    cv2 = opencv("a stream's key frames")
    grey = frame if frame.ndim == 2 else cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY)
    small: Array = cv2.resize(grey, THUMBNAIL, interpolation=cv2.INTER_AREA)
    return small


@dataclass(frozen=True)
class KeyFrame:
    key: bool
    difference: float  # mean absolute difference to the last key frame, 0..255


def key_frame(last: Array | None, current: Array, threshold: float) -> KeyFrame:
    """Whether ``current`` (a thumbnail) differs enough from ``last`` (the thumbnail of the
    last frame inferred) to be inferred itself. ``threshold`` 0: every frame is."""
    if last is None or threshold <= 0:
        return KeyFrame(True, float("inf") if last is None else 0.0)
    difference = float(np.abs(current.astype(np.int16) - last.astype(np.int16)).mean())
    return KeyFrame(difference >= threshold, difference)


def next_due(due: float, now: float, rate: float) -> tuple[bool, float]:
    """Whether a frame that came at ``now`` is taken by a stream paced to ``rate`` frames
    a second (0: every frame) whose next frame is ``due``; and the next due time."""
    if rate <= 0:
        return True, now
    if now + 1e-9 < due:
        return False, due
    interval = 1.0 / rate
    # the next slot after now, never a burst to catch up on frames that were late
    return True, max(due + interval, now + interval * 0.5)
