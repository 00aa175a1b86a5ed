"""Streams with the rest of the agent: in `edge-agent run` (results in a file and as
server-sent events, /metrics, SIGTERM drains), over MQTT to a real Mosquitto, through a
real gateway (a `personal` stream's frames arrive redacted; a gateway killed mid-stream
gives degraded results, and the stream goes on)."""

from __future__ import annotations

import http.client
import json
import threading
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from skimage import data

from edge_agent.assemble import create_agent, create_connection
from edge_agent.config import load_agent_config
from edge_agent.preprocess import tensor_to_image
from edge_agent.privacy import FaceFinder
from edge_agent.streams import Streams
from edge_core.repository import ModelRepository
from tests.support.backends import RecordingBackend
from tests.support.broker import TestBroker
from tests.support.daemon import metric_value, start_agent
from tests.support.gateway import start_gateway
from tests.support.paths import MODELS


def digit_video(path: Path, frames: int) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30.0, (160, 120))
    for index in range(frames):
        frame = np.zeros((120, 160, 3), np.uint8)
        x = 10 + (index * 5) % 110
        cv2.rectangle(frame, (x, 30), (x + 20, 90), (255, 255, 255), -1)
        writer.write(frame)
    writer.release()
    return path


def face_video(path: Path, frames: int) -> Path:
    """The astronaut's photograph, a 256x256 crop drifting across it: a face in each frame."""
    photo = cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2BGR)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (256, 256))
    for index in range(frames):
        writer.write(np.ascontiguousarray(photo[20 + index * 2 : 276 + index * 2, 100:356]))
    writer.release()
    return path


def agent_config(tmp: Path, extra: str = "") -> Path:
    config = tmp / "agent.toml"
    config.write_text(
        f'device_id = "cam-01"\nprofile = "generic-x86_64"\nmodel_dir = "{MODELS}"\n'
        f'state_dir = "{tmp / "state"}"\n{extra}'
    )
    return config


@pytest.mark.slow
def test_a_stream_in_the_service_answers_every_frame_and_drains_on_sigterm(
    tmp_path: Path,
) -> None:
    video = digit_video(tmp_path / "door.avi", 90)  # 3 s in real time
    out = tmp_path / "door.jsonl"
    streams = (
        f'[[streams]]\nname = "door"\nsource = "{video}"\nmodel = "digits-light"\n'
        f'sink = "jsonl:{out}"\n'
        f'[[streams]]\nname = "hall"\nsource = "{video}"\nmodel = "digits-light"\nsink = "sse"\n'
        f"key_frames = 4\n"
    )
    running = start_agent(tmp_path, extra=streams)
    try:
        running.wait_message("READY=1")
        connection = http.client.HTTPConnection("127.0.0.1", running.http_port, timeout=10)
        connection.request("GET", "/v2/streams/hall/events")
        answer = connection.getresponse()
        assert answer.status == 200 and answer.getheader("Content-Type") == "text/event-stream"
        event = answer.fp.readline().decode()
        assert event.startswith("data: ") and json.loads(event[6:])["stream"] == "hall"
        connection.close()
        assert running.get("/v2/streams/nothing/events")[0] == 404
        end = time.monotonic() + 20
        while not out.exists() or len(out.read_text().splitlines()) < 5:
            assert time.monotonic() < end, "no results in the file"
            time.sleep(0.05)
        metrics = running.get("/metrics")[1].decode()
        assert (metric_value(metrics, "edge_agent_stream_frames_total", stream="door",
                             outcome="out") or 0) >= 5  # fmt: skip
        started = time.monotonic()
        assert running.stop() == 0  # SIGTERM, mid-stream
        assert time.monotonic() - started < 8  # [api] drain_s = 5 in these configurations
    finally:
        running.stop()
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["frame"] for r in results] == sorted(r["frame"] for r in results)
    assert all(r["decision"] == "LOCAL" and r["answer"]["top_k"] for r in results)


@pytest.mark.broker
def test_stream_results_reach_the_broker(tmp_path: Path) -> None:
    with TestBroker(tmp_path / "broker") as broker:
        received: list[dict[str, Any]] = []
        listener = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        subscribed = threading.Event()
        listener.on_connect = lambda c, u, f, r, p: c.subscribe("devices/+/streams/+/results")
        listener.on_subscribe = lambda *args: subscribed.set()
        listener.on_message = lambda c, u, m: received.append(
            {"topic": m.topic, **json.loads(m.payload)}
        )
        listener.connect("127.0.0.1", broker.port)
        listener.loop_start()
        assert subscribed.wait(10)
        video = digit_video(tmp_path / "door.avi", 15)
        password = tmp_path / "pw"
        password.write_text("x")
        password.chmod(0o600)
        config = load_agent_config(agent_config(
            tmp_path,
            f'[mqtt]\nport = {broker.port}\npassword_file = "{password}"\n'
            f'[[streams]]\nname = "door"\nsource = "{video}"\nmodel = "digits-light"\n'
            'sink = "mqtt"\nrealtime = false\n',
        ))  # fmt: skip
        connection = create_connection(config)
        connection.start()
        assert connection.wait_connected(10)
        agent = create_agent(config, connection=connection)
        try:
            streams = Streams(config.streams, agent=lambda: agent, device_id="cam-01",
                              connection=connection)  # fmt: skip
            streams.start()
            assert streams.streams["door"].join(30)
            end = time.monotonic() + 10
            while len(received) < 15 and time.monotonic() < end:
                time.sleep(0.05)
        finally:
            agent.close()
            connection.close()
            listener.loop_stop()
    assert len(received) == 15, received[-1:]
    assert {r["topic"] for r in received} == {"devices/cam-01/streams/door/results"}
    assert [r["frame"] for r in received] == list(range(15))


@pytest.fixture
def gateway(tmp_path: Path, fetched: ModelRepository) -> Any:
    handle = start_gateway(tmp_path / "gateway", MODELS, backend=RecordingBackend(),
                           poll_interval_s=0.0)  # fmt: skip
    token = tmp_path / "device.token"
    token.write_text(handle.device_token)
    token.chmod(0o600)
    yield handle, token
    handle.thread.stop()


@pytest.mark.slow
def test_a_personal_streams_frames_arrive_at_the_gateway_redacted(
    tmp_path: Path,
    gateway: Any,
    fetched: ModelRepository,
    face_detectors: tuple[FaceFinder, FaceFinder],
) -> None:
    handle, token = gateway
    video = face_video(tmp_path / "astronaut.avi", 6)
    config = load_agent_config(agent_config(tmp_path, (
        f'[gateway]\naddress = "{handle.grpc_url}"\ntoken_file = "{token}"\n'
        f'[[streams]]\nname = "lobby"\nsource = "{video}"\nmodel = "ppocr-det"\n'
        'label = "personal"\nrealtime = false\nsink = "jsonl:' + str(tmp_path / "r.jsonl") + '"\n'
    )))  # fmt: skip
    agent = create_agent(config)
    try:
        streams = Streams(config.streams, agent=lambda: agent, device_id="cam-01")
        streams.start()
        assert streams.streams["lobby"].join(120)
    finally:
        agent.close()
    results = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert len(results) == 6
    assert all(r["decision"] == "OFFLOAD_REDACTED" and r["where"] == "cloud" for r in results)
    received = handle.gateway.repository.backend.received["ppocr-det"]
    assert len(received) == 6
    _, checker = face_detectors  # the stronger eye
    pre = fetched.get("ppocr-det").preprocessing
    for feed in received:  # the gateway's side: no face in what it got
        view = tensor_to_image(feed["x"][0], pre)
        assert view is not None and checker.detect(view.rgb) == []


@pytest.mark.slow
def test_a_gateway_killed_mid_stream_gives_degraded_results_and_no_stall(
    tmp_path: Path, gateway: Any
) -> None:
    handle, token = gateway
    video = digit_video(tmp_path / "door.avi", 60)
    out = tmp_path / "r.jsonl"
    config = load_agent_config(agent_config(tmp_path, (
        f'deadline_ms = 500\n[gateway]\naddress = "{handle.grpc_url}"\ntoken_file = "{token}"\n'
        '[breaker]\nfailures = 2\ncooldown_s = 60\n'
        f'[[streams]]\nname = "door"\nsource = "{video}"\nmodel = "digits-heavy"\n'
        f'sink = "jsonl:{out}"\n'
    )))  # fmt: skip
    agent = create_agent(config)
    try:
        streams = Streams(config.streams, agent=lambda: agent, device_id="cam-01")
        streams.start()
        end = time.monotonic() + 20
        while not out.exists() or len(out.read_text().splitlines()) < 10:
            assert time.monotonic() < end
            time.sleep(0.02)
        handle.thread.stop()  # the gateway goes away, mid-stream
        assert streams.streams["door"].join(30), "the stream stalled"
    finally:
        agent.close()
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert results[0]["where"] == "cloud" and not results[0]["degraded"]
    after = [r for r in results if r.get("degraded")]
    assert after and all(r["where"] == "device" and r["model"] == "digits-light" for r in after)
    assert not [r for r in results if "error" in r]  # none failed: the light model stood in
    assert results[-1]["frame"] >= 55  # it went on to the end


def next_event(answer: Any) -> bytes:
    """The next event's line of a server-sent-event answer (blank lines, keep-alives
    skipped); ``b""`` once the answer has ended."""
    while (line := answer.fp.readline()) in (b"\n", b": keep-alive\n"):
        pass
    return bytes(line)


@pytest.mark.slow
def test_sighup_restarts_the_streams_and_ends_their_listeners(tmp_path: Path) -> None:
    """A reload with other streams: the old ones drain and their event listeners end (they
    would wait on a stream that is gone); a reload whose stream cannot run is refused and
    the running streams go on."""
    import signal

    from tests.support.daemon import wait_logged

    video = digit_video(tmp_path / "door.avi", 900)  # 30 s: it runs through the test
    hall = f'[[streams]]\nname = "hall"\nsource = "{video}"\nmodel = "digits-light"\nsink = "sse"\n'
    running = start_agent(tmp_path, extra=hall)
    try:
        running.wait_message("READY=1")
        listener = http.client.HTTPConnection("127.0.0.1", running.http_port, timeout=10)
        listener.request("GET", "/v2/streams/hall/events")
        events = listener.getresponse()
        assert events.fp.readline().startswith(b"data: ")
        good = running.config.read_text()
        broken = good.replace('sink = "sse"', f'sink = "jsonl:{tmp_path}/no/such/folder.jsonl"')
        running.config.write_text(broken)
        before = len(running.messages)
        running.process.send_signal(signal.SIGHUP)
        running.wait_message("READY=1", after=before)
        assert "no folder" in wait_logged(running, "reload refused")[0]
        assert next_event(events).startswith(b"data: ")  # the running stream goes on
        running.config.write_text(good.replace('name = "hall"', 'name = "lobby"'))
        before = len(running.messages)
        running.process.send_signal(signal.SIGHUP)
        running.wait_message("READY=1", after=before)
        end = time.monotonic() + 10
        while (line := events.fp.readline()) and time.monotonic() < end:
            pass  # what was left, then the end of the answer
        assert line == b"" and time.monotonic() < end, "the listener of 'hall' did not end"
        listener.close()
        assert running.get("/v2/streams/hall/events")[0] == 404
        lobby = http.client.HTTPConnection("127.0.0.1", running.http_port, timeout=10)
        lobby.request("GET", "/v2/streams/lobby/events")
        assert lobby.getresponse().fp.readline().startswith(b"data: ")
        lobby.close()
    finally:
        running.stop()
