"""Streams: the pure rules (newest frame wins, key frames, pacing), and the pipeline on a
video file the test writes, with a slow inference at the stream's seam and with a real
agent."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from edge_agent.agent import DEFAULT_POLICY, Agent, AgentResult
from edge_agent.config import StreamSettings
from edge_agent.policy import Action, Decision, load_policy
from edge_agent.profiles import ProfileStore
from edge_agent.profiles.state import DeviceState
from edge_agent.streams import Streams, open_capture
from edge_agent.streams.pipeline import Stream
from edge_agent.streams.rules import LatestSlot, key_frame, next_due, thumbnail
from edge_core.repository import ModelRepository
from tests.support.paths import MODELS, PROFILES

LIGHT = ModelRepository(MODELS).get("digits-light")


def write_video(path: Path, frames: int, fps: float = 30.0, *, still: bool = False) -> Path:
    """A 160x120 clip: a white digit-like block that moves (or stays) on black."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, (160, 120))
    assert writer.isOpened()
    for index in range(frames):
        frame = np.zeros((120, 160, 3), np.uint8)
        x = 20 if still else 10 + (index * 4) % 120
        cv2.rectangle(frame, (x, 30), (x + 20, 90), (255, 255, 255), -1)
        writer.write(frame)
    writer.release()
    return path


def test_the_newest_frame_wins_and_each_drop_is_counted() -> None:
    slot: LatestSlot[int] = LatestSlot()
    assert slot.put(1) is False and slot.put(2) is True and slot.put(3) is True
    assert slot.take(0) == 3 and slot.take(0) is None
    slot.put(4)
    slot.close()
    assert not slot.done and slot.take(0) == 4 and slot.done and slot.take(0) is None


def test_a_frame_like_the_last_one_inferred_is_skipped() -> None:
    a = np.zeros((120, 160, 3), np.uint8)
    b = a.copy()
    b[:, :80] = 255  # half the picture changed
    ta, tb = thumbnail(a), thumbnail(b)
    assert key_frame(None, ta, 5.0).key  # the first frame always is
    assert not key_frame(ta, ta, 5.0).key and key_frame(ta, ta, 5.0).difference == 0
    changed = key_frame(ta, tb, 5.0)
    assert changed.key and 120 < changed.difference < 135
    assert key_frame(ta, ta, 0.0).key  # 0: every frame


def test_a_paced_stream_takes_a_frame_at_most_as_often_as_its_rate() -> None:
    due, taken = 0.0, []
    for step in range(300):  # a 30 fps camera for 10 s, a stream paced to 5 fps
        now = step / 30
        take, due = next_due(due, now, 5.0)
        if take:
            taken.append(now)
    assert 48 <= len(taken) <= 51
    assert min(np.diff(taken)) >= 0.19
    assert next_due(0.0, 1.0, 0.0) == (True, 1.0)  # no rate: every frame


def settings(source: Path, **extra: Any) -> StreamSettings:
    return StreamSettings(name="cam", source=str(source), model="digits-light", **extra)


def run_stream(stream: Stream, timeout: float = 30) -> None:
    stream.start()
    assert stream.join(timeout), "the stream did not end with its file"


@pytest.mark.slow
def test_a_slow_model_drops_old_frames_and_results_come_in_order(tmp_path: Path) -> None:
    """A 30 fps file read in real time, a model that takes 80 ms a frame: most frames
    are dropped (the newest waiting wins), none once inferred, and the results are in
    order."""
    video = write_video(tmp_path / "clip.avi", 45)
    results: list[dict[str, Any]] = []

    decision = Decision(Action.LOCAL, "prefer_local", "", "digits-light", "public")

    def slow(model: str, inputs: dict[str, Any], **kwargs: Any) -> AgentResult:
        assert inputs["pixels"].shape == (1, 64)  # preprocessed as the manifest says
        time.sleep(0.08)
        outputs = {"probabilities": np.full((1, 10), 0.1, np.float32)}
        return AgentResult("digits-light", outputs, decision, "device", 80.0, "r", version=1)

    stream = Stream(
        settings(video), LIGHT, open_capture=lambda: open_capture(str(video)), infer=slow,
        emit=results.append,
    )  # fmt: skip
    run_stream(stream)
    counts = stream.stats.snapshot()["frames"]
    assert counts["in"] == 45
    assert counts["out"] == len(results) and counts["out"] + counts["dropped"] == 45
    assert counts["dropped"] >= 20, counts  # 80 ms a frame against 33 ms between frames
    frames = [r["frame"] for r in results]
    assert frames == sorted(frames) and len(set(frames)) == len(frames)
    first = results[0]
    assert set(first["stages_ms"]) == {"decode", "preprocess", "infer", "postprocess"}
    assert first["latency_ms"] >= first["stages_ms"]["infer"] >= 75
    assert first["answer"]["top_k"][0][0]["score"] == pytest.approx(0.1)


def test_a_still_scene_is_inferred_once_with_key_frames(tmp_path: Path) -> None:
    video = write_video(tmp_path / "still.avi", 20, still=True)
    calls, results = [], []
    agent = local_agent()
    try:

        def counted(model: str, inputs: Any, **kwargs: Any) -> Any:
            calls.append(1)
            return agent.infer(model, inputs, **kwargs)

        stream = Stream(
            settings(video, key_frames=8.0, realtime=False), LIGHT,
            open_capture=lambda: open_capture(str(video)), infer=counted, emit=results.append,
        )  # fmt: skip
        run_stream(stream)
    finally:
        agent.close()
    counts = stream.stats.snapshot()["frames"]
    assert len(calls) == 1 and counts["skipped"] == len(results) - 1 and len(results) >= 2
    assert all(r["skipped"] for r in results[1:]) and not results[0]["skipped"]
    assert results[-1]["answer"] == results[0]["answer"]  # the last result carried over


def local_agent() -> Agent:
    return Agent(
        profile=ProfileStore(PROFILES).get("generic-x86_64"),
        repository=ModelRepository(MODELS),
        rules=load_policy(DEFAULT_POLICY),
        device_state=lambda: DeviceState(),
    )


def test_every_frame_goes_through_the_agent(tmp_path: Path) -> None:
    video = write_video(tmp_path / "clip.avi", 12)
    out = tmp_path / "results.jsonl"
    agent = local_agent()
    entry = StreamSettings(
        name="door", source=str(video), model="digits-light", label="sensitive",
        realtime=False, sink=f"jsonl:{out}",
    )  # fmt: skip
    try:
        streams = Streams((entry,), agent=lambda: agent, device_id="cam-01")
        streams.start()
        assert streams.streams["door"].join(30)
        assert streams.stop(5)
    finally:
        agent.close()
    import json

    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines and all(
        line["decision"] == "LOCAL" and line["where"] == "device" for line in lines
    )
    assert all(line["answer"]["top_k"][0][0]["label"] in LIGHT.labels for line in lines)
    snapshot = streams.snapshot()["door"]
    assert snapshot["frames"]["out"] == len(lines)
    assert snapshot["latency_ms"]["end_to_end"]["count"] == len(lines)


def test_a_failing_sink_loses_results_not_the_stream_and_a_closed_pipe_stops_it(
    tmp_path: Path,
) -> None:
    video = write_video(tmp_path / "clip.avi", 30)
    agent = local_agent()

    def full_disk(result: dict[str, Any]) -> None:
        raise OSError(28, "No space left on device")

    def closed_pipe(result: dict[str, Any]) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    try:
        streams = [
            Stream(
                settings(video, realtime=False),
                LIGHT,
                open_capture=lambda: open_capture(str(video)),
                infer=agent.infer,
                emit=sink,
            )
            for sink in (full_disk, closed_pipe)
        ]
        for stream in streams:
            run_stream(stream)
    finally:
        agent.close()
    disk, pipe = (stream.stats.snapshot()["frames"] for stream in streams)
    assert disk["in"] == disk["out"] == disk["unsent"] == 30  # it went on to the end
    assert pipe["in"] < 30 and pipe["unsent"] == pipe["out"]  # nobody reads: it stopped


class FakeCapture:
    """A live source's capture at our seam: ``frames`` frames, then it stops giving any."""

    def __init__(self, frames: int) -> None:
        self.left = frames
        self.released = False

    def read(self) -> tuple[bool, np.ndarray | None]:
        if self.left <= 0:
            return False, None
        self.left -= 1
        return True, np.zeros((48, 64, 3), np.uint8)

    def release(self) -> None:
        self.released = True

    def get(self, prop: int) -> float:
        return 30.0


def test_a_stage_that_raises_fails_its_frame_not_the_stream(tmp_path: Path) -> None:
    """A runtime that raises something no stage expects: that frame's result carries the
    error, the others are answered, and the stream ends (it used to hang for good)."""
    video = write_video(tmp_path / "clip.avi", 12)
    results: list[dict[str, Any]] = []
    agent = local_agent()
    calls = []

    def flaky(model: str, inputs: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("the accelerator went away")
        return agent.infer(model, inputs, **kwargs)

    try:
        stream = Stream(
            settings(video, realtime=False), LIGHT, infer=flaky, emit=results.append,
            open_capture=lambda: open_capture(str(video)),
        )  # fmt: skip
        run_stream(stream, timeout=20)
    finally:
        agent.close()
    failed = [r for r in results if "error" in r]
    assert len(results) == 12 and [r["frame"] for r in failed] == [2]
    assert "RuntimeError: the accelerator went away" in failed[0]["error"]
    counts = stream.stats.snapshot()["frames"]
    assert counts["failed"] == 1 and counts["in"] == counts["out"] + counts["dropped"] == 12


def test_a_live_source_that_stops_is_reopened_and_its_frames_numbered_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from edge_agent.streams import source

    monkeypatch.setattr(source, "REOPEN_FIRST_S", 0.01)
    opened: list[FakeCapture] = []

    def open_camera() -> FakeCapture:
        if len(opened) == 1 and not hasattr(open_camera, "refused"):
            open_camera.refused = True  # type: ignore[attr-defined]
            raise OSError("no such device")  # unplugged for a moment
        opened.append(FakeCapture(3))
        return opened[-1]

    results: list[dict[str, Any]] = []
    entry = StreamSettings(name="door", source="/dev/video9", model="digits-light")
    decision = Decision(Action.LOCAL, "prefer_local", "", "digits-light", "public")
    outputs = {"probabilities": np.full((1, 10), 0.1, np.float32)}
    stream = Stream(
        entry, LIGHT, open_capture=open_camera, emit=results.append,
        infer=lambda *a, **k: AgentResult("digits-light", outputs, decision, "device", 1.0, "r"),
    )  # fmt: skip
    stream.start()
    end = time.monotonic() + 10

    def third_capture_seen() -> bool:
        # (the newest frame wins: any of a capture's frames may be dropped, not all)
        return len(opened) >= 3 and any(r["frame"] >= 6 for r in list(results))

    while not third_capture_seen() and time.monotonic() < end:
        time.sleep(0.01)
    assert stream.stop(5)
    assert len(opened) >= 3 and all(c.released for c in opened)
    frames = [r["frame"] for r in results]
    assert frames == sorted(set(frames)) and frames[-1] >= 6  # 0, 1, 2, then 3, 4, 5 ...
    assert stream.stats.reopened >= 2 and stream.stats.state == "ended"
    assert stream.error is None


def test_a_file_that_cannot_be_read_ends_its_stream_with_the_reason(tmp_path: Path) -> None:
    def missing() -> Any:
        return open_capture(str(tmp_path / "nothing.avi"))

    stream = Stream(
        settings(tmp_path / "nothing.avi"), LIGHT, open_capture=missing, emit=print,
        infer=lambda *a, **k: None,
    )  # fmt: skip
    run_stream(stream, timeout=5)
    assert stream.stats.state == "failed" and "cannot open" in (stream.error or "")
    assert stream.stats.snapshot()["frames"]["in"] == 0


def test_streams_that_cannot_run_open_nothing(tmp_path: Path) -> None:
    from edge_core.errors import ConfigError

    video = write_video(tmp_path / "clip.avi", 3)
    good = StreamSettings(name="a", source=str(video), model="digits-light",
                          sink=f"jsonl:{tmp_path / 'a.jsonl'}")  # fmt: skip
    agent = local_agent()
    try:
        for bad, why in (
            (StreamSettings(name="b", source=str(video), model="nope"), "not on this device"),
            (StreamSettings(name="b", source=str(video), model="digits-light",
                            sink=f"jsonl:{tmp_path / 'no' / 'b.jsonl'}"), "cannot open"),
            (StreamSettings(name="b", source=str(video), model="digits-light", sink="mqtt"),
             "sink mqtt needs an"),
        ):  # fmt: skip
            with pytest.raises(ConfigError, match=why):
                Streams((good, bad), agent=lambda: agent, device_id="cam-01")
    finally:
        agent.close()
    assert not (tmp_path / "a.jsonl").exists()  # checked before any sink was opened


@pytest.mark.slow
def test_stopping_mid_stream_accounts_for_every_frame_taken(tmp_path: Path) -> None:
    video = write_video(tmp_path / "clip.avi", 90)
    agent = local_agent()
    try:
        streams = Streams(
            (StreamSettings(name="door", source=str(video), model="digits-light",
                            sink=f"jsonl:{tmp_path / 'r.jsonl'}"),),
            agent=lambda: agent, device_id="cam-01",
        )  # fmt: skip
        streams.start()
        time.sleep(1.0)  # a third of the clip, in real time
        assert streams.stop(5)
    finally:
        agent.close()
    counts = streams.snapshot()["door"]["frames"]
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert 10 < counts["in"] < 90 and counts["in"] == counts["out"] + counts["dropped"]
    assert len(lines) == counts["out"]


def test_listeners_of_a_stream_that_goes_away_end() -> None:
    from edge_agent.streams.sinks import Broadcaster

    broadcaster = Broadcaster(per_subscriber=2)
    listener = broadcaster.subscribe()
    assert listener is not None
    for index in range(3):
        broadcaster({"frame": index, "score": float("nan")})
    assert broadcaster.dropped == 1  # a slow listener lost the oldest
    broadcaster.close()
    assert listener.next(1) == '{"frame":1,"score":null}'  # what was left, strict JSON
    assert listener.next(1) is not None and listener.next(5) is None and listener.ended
    assert broadcaster.subscribe() is None


class BigFrames(FakeCapture):
    """A camera whose frames are larger than it says (its properties give no size)."""

    def read(self) -> tuple[bool, np.ndarray | None]:
        if self.left <= 0:
            return False, None
        self.left -= 1
        return True, np.zeros((480, 640, 3), np.uint8)

    def get(self, prop: int) -> float:
        return 0.0


def test_frames_over_the_pixel_limit_end_the_stream_failed(tmp_path: Path) -> None:
    """Issue 29, item 1: a source whose frames are over ``[limits] max_image_pixels``
    ends failed, with the limit named; by what its container says (a file), or by the
    first frame when it says nothing (a camera); reopening would not shrink them."""
    video = write_video(tmp_path / "clip.avi", 5)
    results: list[dict[str, Any]] = []
    stream = Stream(
        settings(video, realtime=False), LIGHT, infer=lambda *a, **k: None,
        emit=results.append, open_capture=lambda: open_capture(str(video)), max_pixels=10_000,
    )  # fmt: skip
    run_stream(stream, timeout=20)
    assert stream.stats.state == "failed" and results == []
    assert stream.error is not None and "160x120 (19,200 pixels)" in stream.error
    assert "limit of 10,000 pixels" in stream.error
    entry = StreamSettings(name="door", source="/dev/video9", model="digits-light")
    camera = Stream(
        entry, LIGHT, open_capture=lambda: BigFrames(3), emit=results.append,
        infer=lambda *a, **k: None, max_pixels=100_000,
    )  # fmt: skip
    run_stream(camera, timeout=20)
    assert camera.stats.state == "failed" and results == []
    assert camera.error is not None and "640x480 (307,200 pixels)" in camera.error
