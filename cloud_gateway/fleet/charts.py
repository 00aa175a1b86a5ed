"""Small line charts of a device's history, drawn by the page as inline SVG.

Pure: each chart is its series' coordinates in a fixed box (numbers only; the
template writes them into ``<polyline points=…>``), the scale's top and the
latest values, from the history points and the time window passed in. No
script, no style attribute: the page's Content-Security-Policy allows neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["HEIGHT", "WIDTH", "Chart", "Series", "device_charts", "line_chart", "per_minute"]

WIDTH = 360
HEIGHT = 90


@dataclass(frozen=True)
class Series:
    name: str
    points: str  # "x,y x,y ..." in the chart's box
    last: float | None
    index: int  # its colour, by position (the stylesheet's .s0, .s1, ...)


@dataclass(frozen=True)
class Chart:
    title: str
    unit: str
    top: float  # the value at the top of the box
    series: tuple[Series, ...]

    @property
    def empty(self) -> bool:
        return not any(s.points for s in self.series)


def _nice(value: float) -> float:
    """A round number at or above ``value`` for the scale's top."""
    if value <= 0:
        return 1.0
    step = 10 ** len(str(int(value))) / 10 if value >= 1 else 0.1
    while step * 10 < value:
        step *= 10
    for factor in (1, 2, 2.5, 5, 10):
        if step * factor >= value:
            return step * factor
    return value


def line_chart(
    title: str,
    unit: str,
    start: float,
    end: float,
    series: dict[str, Sequence[tuple[float, float | None]]],
) -> Chart:
    """Each named series' points ``(time, value)`` (``None``: a gap) over ``[start, end]``."""
    values = [  # the scale fits what is drawn: the window's points only
        v for points in series.values() for at, v in points if v is not None and start <= at <= end
    ]
    top = _nice(max(values) if values else 0.0)
    span = max(end - start, 1.0)
    drawn = []
    for index, (name, points) in enumerate(series.items()):
        coords = []
        last = None
        for at, value in points:
            if value is None or not start <= at <= end:
                continue
            x = (at - start) / span * WIDTH
            y = HEIGHT - min(value / top, 1.0) * HEIGHT
            coords.append(f"{x:.1f},{y:.1f}")
            last = value
        drawn.append(Series(name, " ".join(coords), last, index))
    return Chart(title, unit, top, tuple(drawn))


def per_minute(points: Sequence[tuple[float, float | None]]) -> list[tuple[float, float | None]]:
    """Counts since the agent started, as a rate a minute between points (an agent that
    restarted counts from zero again: its first count is the rate)."""
    out: list[tuple[float, float | None]] = []
    previous: tuple[float, float] | None = None
    for at, value in points:
        if value is None:
            continue
        if previous is not None:
            minutes = max((at - previous[0]) / 60, 1.0)
            rise = value - previous[1] if value >= previous[1] else value
            out.append((at, rise / minutes))
        previous = (at, value)
    return out


def device_charts(history: list[dict[str, Any]], start: float, end: float) -> list[Chart]:
    """Latency, decisions a minute by action, temperature and CPU load, and the queue."""

    def column(name: str) -> list[tuple[float, float | None]]:
        return [(row["minute"] * 60.0, row.get(name)) for row in history]

    actions = sorted({a for row in history for a in (row.get("decisions") or {})})
    decisions: dict[str, Sequence[tuple[float, float | None]]] = {
        str(action): per_minute(
            [(row["minute"] * 60.0, (row.get("decisions") or {}).get(action)) for row in history]
        )
        for action in actions[:6]
    }
    return [
        line_chart("latency, p50", "ms", start, end,
                   {"on the device": column("local_ms"), "offloaded": column("offload_ms")}),
        line_chart("decisions a minute", "/min", start, end, decisions or {"none": []}),
        line_chart("hottest thermal zone", "°C", start, end, {"temperature": column("hottest")}),
        line_chart("CPU load, per core", "", start, end, {"load": column("cpu_load")}),
        line_chart("telemetry queue", "messages", start, end,
                   {"waiting": column("queue_waiting")}),
    ]  # fmt: skip
