"""`edge-agent run` as systemd runs it: a subprocess with a test NOTIFY_SOCKET, the
local API called by stock tritonclient, signals, the thermal loop on a fake sysfs,
/metrics and JSON logs."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_core.repository import ModelRepository
from tests.support.daemon import (
    Running,
    metric_value,
    read_answers,
    start_agent,
    wait_logged,
)
from tests.support.paths import MODELS
from tests.support.roots import make_root

LIGHT = ModelRepository(MODELS).get("digits-light")


def light_rows(rows: int = 4) -> np.ndarray:
    return LIGHT.evaluation()[0][:rows].astype(np.float32)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Running]:
    running = start_agent(tmp_path)
    running.wait_message("READY=1")
    yield running
    running.stop()


@pytest.mark.slow
def test_the_http_api_on_a_unix_socket(tmp_path: Path) -> None:
    sock = tmp_path / "run" / "api.sock"
    running = start_agent(tmp_path, api=f'socket = "{sock}"')
    try:
        running.wait_message("READY=1")

        class UnixConnection(http.client.HTTPConnection):
            def connect(self) -> None:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.connect(str(sock))

        connection = UnixConnection("localhost", timeout=10)
        connection.request("GET", "/v2/health/ready")
        assert connection.getresponse().status == 200
        assert oct(sock.stat().st_mode & 0o777) == "0o660"
    finally:
        assert running.stop() == 0
    assert not sock.exists()  # removed at stop


@pytest.mark.slow
def test_a_bad_post_gets_one_answer_and_the_connection_goes_on(agent: Running) -> None:
    with socket.create_connection(("127.0.0.1", agent.http_port), timeout=10) as sock:
        sock.sendall(
            b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
            b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        data = read_answers(sock, 2)
    assert data.count("HTTP/1.1 ") == 2, data  # one answer per request, in order
    assert data.startswith("HTTP/1.1 404") and "HTTP/1.1 200" in data
    with socket.create_connection(("127.0.0.1", agent.http_port), timeout=10) as sock:
        sock.sendall(  # a chunked body is read whole: the next request is read as one
            b"POST /nowhere HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
            b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        data = read_answers(sock, 2)
    assert data.count("HTTP/1.1 ") == 2 and data.startswith("HTTP/1.1 404"), data
    assert "HTTP/1.1 200" in data


@pytest.mark.slow
def test_ready_then_watchdog_pings_at_half_the_interval(agent: Running) -> None:
    ready = agent.wait_message("READY=1")
    assert any(line.startswith("STATUS=serving digits-light") for _, line in agent.messages)
    time.sleep(1.2)
    pings = [at for at, line in agent.messages if line == "WATCHDOG=1" and at > ready]
    # WATCHDOG_USEC=400000: one ping every 0.2 s (timed on arrival here, so with some
    # jitter); systemd would act on a gap of 0.4 s
    assert 3 <= len(pings) <= 8, pings
    gaps = np.diff(pings)
    assert 0.15 < float(np.median(gaps)) < 0.3, gaps
    assert gaps.max() < 0.4, gaps
    assert agent.stop() == 0
    assert any(line == "STOPPING=1" for _, line in agent.messages)


@pytest.mark.slow
def test_stock_tritonclient_gets_the_agents_answers(agent: Running) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from edge_core.runtime import RuntimeOptions, open_best

    x = light_rows()
    _, session = open_best(LIGHT, RuntimeOptions(threads=1), precisions=("int8", "fp32"),
                           formats=("tflite", "onnx"))  # fmt: skip
    expected = session.run({"pixels": x})["probabilities"]

    client = httpclient.InferenceServerClient(f"127.0.0.1:{agent.http_port}")
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("digits-light")
    metadata = client.get_model_metadata("digits-light")
    assert metadata["inputs"][0]["name"] == "pixels"
    inputs = httpclient.InferInput("pixels", list(x.shape), "FP32")
    inputs.set_data_from_numpy(x, binary_data=True)
    result = client.infer("digits-light", [inputs], headers={"X-Request-Id": "req-http-1"})
    assert np.allclose(result.as_numpy("probabilities"), expected, atol=1e-6)
    parameters = result.get_response()["parameters"]
    assert parameters["edge_where"] == "device" and parameters["edge_model"] == "digits-light"
    assert parameters["request_id"] == "req-http-1"

    gclient = grpcclient.InferenceServerClient(f"127.0.0.1:{agent.grpc_port}")
    assert gclient.is_server_ready() and gclient.is_model_ready("digits-light")
    ginputs = grpcclient.InferInput("pixels", list(x.shape), "FP32")
    ginputs.set_data_from_numpy(x)
    gresult = gclient.infer("digits-light", [ginputs], headers={"x-edge-label": "public"})
    assert np.allclose(gresult.as_numpy("probabilities"), expected, atol=1e-6)
    gparams = gresult.get_response().parameters
    assert gparams["edge_action"].string_param == "LOCAL"
    assert gparams["edge_where"].string_param == "device"
    # errors are statuses, not tracebacks
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="unknown model"):
        gclient.infer("nope", [ginputs])
    with pytest.raises(InferenceServerException, match="unknown label"):
        client.infer("digits-light", [inputs], headers={"X-Edge-Label": "secret"})
    status, body = agent.post_json("/v2/models/digits-light/infer", {"inputs": 5})
    assert status == 400 and "inputs" in body["error"]


@pytest.mark.slow
def test_metrics_and_json_logs_with_request_ids(agent: Running) -> None:
    x = light_rows(1)
    document = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32",
                            "data": x.ravel().tolist()}]}  # fmt: skip
    for index in range(5):
        status, _ = agent.post_json(
            "/v2/models/digits-light/infer", document, {"X-Request-Id": f"req-{index}"}
        )
        assert status == 200
    status, body = agent.get("/metrics")
    text = body.decode()
    assert status == 200
    assert (metric_value(text, "edge_agent_requests_total", model="digits-light") or 0) >= 5
    assert (metric_value(text, "edge_agent_request_seconds_count", where="device") or 0) >= 5
    assert metric_value(text, "edge_agent_temperature_celsius", zone="cpu") == 50.0
    assert metric_value(text, "edge_agent_power_mode", mode="balanced") == 1.0
    assert metric_value(text, "edge_agent_thermal_level", level="normal") == 1.0
    assert metric_value(text, "edge_agent_model_loaded", model="digits-light", version="1") == 1.0
    wait_logged(agent, "ready in")
    logs = agent.logs()
    assert logs and all({"time", "level", "logger", "message"} <= set(entry) for entry in logs)


@pytest.mark.slow
def test_the_thermal_loop_steps_down_and_back_up(agent: Running) -> None:
    temp = agent.root / "sys/class/thermal/thermal_zone0/temp"
    governor = agent.root / "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"
    max_freq = agent.root / "sys/devices/system/cpu/cpu0/cpufreq/scaling_max_freq"

    def level() -> str:
        text = agent.get("/metrics")[1].decode()
        for name in ("normal", "hot", "critical"):
            if metric_value(text, "edge_agent_thermal_level", level=name) == 1.0:
                return name
        return "?"

    def wait(condition: Any, what: str) -> None:
        end = time.monotonic() + 10
        while not condition():
            assert time.monotonic() < end, what
            time.sleep(0.05)

    assert governor.read_text().strip() == "ondemand"  # balanced, applied at start
    temp.write_text("82000\n")
    wait(lambda: level() == "hot" and max_freq.read_text().strip() == "1500000", "step down")
    temp.write_text("86000\n")
    wait(lambda: level() == "critical", "critical")
    x = light_rows(1)
    document = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32",
                            "data": x.ravel().tolist()}]}  # fmt: skip
    status, body = agent.post_json("/v2/models/digits-light/infer", document)
    assert status in (403, 503) and "critical" in json.dumps(body)  # no local work, no gateway
    temp.write_text("60000\n")
    wait(lambda: level() == "normal", "cool down")
    wait(
        lambda: metric_value(agent.get("/metrics")[1].decode(), "edge_agent_power_mode",
                             mode="balanced") == 1.0,
        "back to balanced",
    )  # fmt: skip
    assert agent.post_json("/v2/models/digits-light/infer", document)[0] == 200


@pytest.mark.slow
def test_sighup_reloads_a_good_config_and_refuses_a_broken_one(agent: Running) -> None:
    x = light_rows(1)
    document = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32",
                            "data": x.ravel().tolist()}]}  # fmt: skip
    status, body = agent.post_json("/v2/models/digits-light/infer", document)
    assert status == 200
    policy = agent.config.parent / "policy.toml"
    policy.write_text('version = 1\n[models.digits-light]\nplacement = "cloud"\n')
    agent.config.write_text(agent.config.read_text().replace(
        'device_id = "cam-01"', f'device_id = "cam-01"\npolicy = "{policy}"'))  # fmt: skip
    before = len(agent.messages)
    agent.process.send_signal(signal.SIGHUP)
    agent.wait_message("RELOADING=1", after=before)
    agent.wait_message("READY=1", after=before)
    status, body = agent.post_json("/v2/models/digits-light/infer", document)
    assert status == 403, body  # cloud only now, and no gateway: refused
    good = agent.config.read_text()
    agent.config.write_text(good + "\n[api\nbroken")
    before = len(agent.messages)
    agent.process.send_signal(signal.SIGHUP)
    agent.wait_message("READY=1", after=before)
    refused = wait_logged(agent, "reload refused")
    assert len(refused) == 1
    # the line says why: the file, what is wrong and where
    assert f"{agent.config}: invalid TOML" in refused[0]
    assert "line " in refused[0]
    status, _ = agent.post_json("/v2/models/digits-light/infer", document)
    assert status == 403  # still the good one
    # a policy that is not even text
    agent.config.write_text(good)
    policy.write_bytes(b"\xff\xfe\x00garbage")
    before = len(agent.messages)
    agent.process.send_signal(signal.SIGHUP)
    agent.wait_message("READY=1", after=before)
    refused = wait_logged(agent, "reload refused", count=2)
    assert str(policy) in refused[1]  # the policy file is named
    assert agent.post_json("/v2/models/digits-light/infer", document)[0] == 403
    assert agent.process.poll() is None


@pytest.mark.slow
def test_sighup_keeps_the_device_settings_and_says_they_take_a_restart(
    agent: Running, tmp_path: Path
) -> None:
    def variant() -> str:
        text = agent.get("/metrics")[1].decode()
        for line in text.splitlines():
            if line.startswith("edge_agent_model_loaded{") and 'model="digits-light"' in line:
                return line.split('variant="')[1].split('"')[0]
        return "?"

    assert variant() == "tflite-int8"  # raspberry-pi-5
    other = make_root(tmp_path / "other-root", cpus=2, temperatures={0: 90_000})
    text = agent.config.read_text()
    text = text.replace('device_id = "cam-01"', 'device_id = "cam-02"')
    text = text.replace('profile = "raspberry-pi-5"', 'profile = "jetson-orin-nano"')
    text = text.replace(f'root = "{agent.root}"', f'root = "{other}"')
    agent.config.write_text(text)
    before = len(agent.messages)
    agent.process.send_signal(signal.SIGHUP)
    agent.wait_message("READY=1", after=before)
    for name in ("device_id", "profile", "root"):
        lines = wait_logged(agent, f"{name} changed: it takes effect at the next restart")
        assert len(lines) == 1
    wait_logged(agent, "reloaded ")  # the log is read from a pipe: READY=1 may come first
    assert not any("reload refused" in e["message"] for e in agent.logs())
    # the running device's settings stay: its profile's variant, its root's temperatures
    assert variant() == "tflite-int8"
    metrics = agent.get("/metrics")[1].decode()
    assert metric_value(metrics, "edge_agent_temperature_celsius", zone="cpu") == 50.0
    assert metric_value(metrics, "edge_agent_thermal_level", level="normal") == 1.0


@pytest.mark.slow
def test_requests_sent_during_a_sighup_reload_all_succeed(agent: Running) -> None:
    x = light_rows(1)
    document = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32",
                            "data": x.ravel().tolist()}]}  # fmt: skip
    results: list[int | str] = []
    stop = threading.Event()

    def burst() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", agent.http_port, timeout=30)
        while not stop.is_set():
            try:
                connection.request("POST", "/v2/models/digits-light/infer", json.dumps(document))
                response = connection.getresponse()
                response.read()
                results.append(response.status)
            except (OSError, http.client.HTTPException) as exc:  # a dropped request: a failure
                results.append(repr(exc))
                connection.close()

    threads = [threading.Thread(target=burst) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        while len(results) < 20:
            time.sleep(0.01)
        for deadline_ms in (900, 800):  # two reloads, each building and warming a new agent
            text = agent.config.read_text()
            agent.config.write_text(f"deadline_ms = {deadline_ms}\n" + text)
            before = len(agent.messages)
            during = len(results)
            agent.process.send_signal(signal.SIGHUP)
            agent.wait_message("RELOADING=1", after=before)
            agent.wait_message("READY=1", after=before)
            assert len(results) > during  # requests went on meanwhile
            agent.config.write_text(text)
        after = len(results)
        while len(results) < after + 20:
            time.sleep(0.01)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert len(wait_logged(agent, "reloaded ", count=2)) == 2
    assert len(results) >= 60
    assert set(results) == {200}, sorted(set(map(str, results)))


class SilentGateway:
    """Accepts HTTP requests, records the headers of inference requests (not the agent's
    questions about the gateway: its index), answers after ``delay`` with 503."""

    def __init__(self, delay: float) -> None:
        headers: list[dict[str, str]] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                if self.path.endswith("/infer"):
                    headers.append(dict(self.headers))
                time.sleep(delay)
                self.send_response(503)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self.headers = headers
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.slow
def test_sigterm_during_a_burst_answers_every_accepted_request(tmp_path: Path) -> None:
    gateway = SilentGateway(delay=0.4)
    token = tmp_path / "device.token"
    token.write_text("cam-01.token\n")
    token.chmod(0o600)
    extra = (f'[gateway]\nprotocol = "http"\naddress = "127.0.0.1:{gateway.port}"\n'
             f'token_file = "{token}"\nretries = 0\n')  # fmt: skip
    running = start_agent(tmp_path, extra)
    try:
        running.wait_message("READY=1")
        x = light_rows(1)
        document = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32",
                                "data": x.ravel().tolist()}], "parameters": {"timeout": 2_000_000}}  # fmt: skip
        results: list[Any] = []

        def call(index: int) -> None:
            try:
                results.append(running.post_json(
                    "/v2/models/digits-heavy/infer", document, {"X-Request-Id": f"burst-{index}"}
                ))  # fmt: skip
            except ConnectionRefusedError as exc:  # after the stop: nothing listens
                results.append(("refused", str(exc)))

        threads = [threading.Thread(target=call, args=(i,)) for i in range(12)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 5
        while len(gateway.headers) < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        in_flight = len(gateway.headers)
        assert in_flight >= 8  # in flight, at the "gateway"
        running.process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(30)
        assert running.process.wait(30) == 0
        # every accepted request was answered (the stand-in answered when the cloud
        # failed); a connection that came after the stop was refused, not dropped
        assert len(results) == 12
        accepted = [body for status, body in results if status == 200]
        assert len(accepted) >= in_flight
        # the others were told (503: stopping) or found nothing listening
        assert all(status in (200, 503, "refused") for status, _ in results), results
        assert all(body["parameters"]["edge_degraded"] for body in accepted)
        # and the request id travelled to the gateway
        sent = {h.get("x-request-id") or h.get("X-Request-Id") for h in gateway.headers}
        assert sent == {body["parameters"]["request_id"] for body in accepted}
        assert sent <= {f"burst-{i}" for i in range(12)}
        # after the stop: nothing listens
        with pytest.raises(ConnectionRefusedError):
            running.post_json("/v2/models/digits-light/infer", document)
        running.wait_message("STOPPING=1")
        # the JSON log lines written while serving a request carry its id
        ids = {entry.get("request_id") for entry in running.logs()}
        assert {body["parameters"]["request_id"] for body in accepted} <= ids
    finally:
        running.stop()
        gateway.close()


def test_the_daemon_leaves_httpxs_command_line_libraries_unloaded() -> None:
    """httpx imports click, rich and pygments (~6 MB) when they are installed, for its
    command line; the daemon, which offloads and updates over httpx, never needs them."""
    code = (
        "import sys\n"
        "from edge_agent.service.daemon import Daemon\n"
        "Daemon()\n"
        "import httpx\n"
        "assert httpx.Client and httpx.main  # httpx without its command line still works\n"
        "print([m for m in ('rich', 'click', 'pygments') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
