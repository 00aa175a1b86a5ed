"""A small OTA world for the tests: signing keys, a repository, a gateway serving it,
enrolled devices, and packages to publish (real ones and deliberately broken ones)."""

from __future__ import annotations

import gzip
import hashlib
import importlib
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from cloud_gateway import GatewayConfig, GatewayThread
from cloud_gateway.auth import DeviceRegistry
from cloud_gateway.ota.groups import GroupKeys, write_bundle
from cloud_gateway.ota.keys import KeyStore
from cloud_gateway.ota.publish import OtaRepository
from cloud_gateway.ota.rollouts import RolloutStore
from edge_agent.config import OtaSettings
from edge_agent.ota import OtaStore, OtaUpdater, load_bundle, smoke_test
from edge_agent.ota.bundle import Enrollment
from edge_agent.profiles import ProfileStore
from edge_core.ota.crypto import (
    encrypt_file,
    unwrap_key,
)
from edge_core.ota.plan import key_target, payload_target

from .packages import sized_package
from .paths import MODELS, PROFILES, ROOT

GROUP = "rpi5-int8"
LIGHT_INT8 = MODELS / "digits-light" / "1" / "model.int8.tflite"
LIGHT_FP32 = MODELS / "digits-light" / "1" / "model.fp32.tflite"


def edit_manifest(folder: Path, **changes: Any) -> None:
    path = folder / "manifest.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def broken_package(tmp: Path) -> Path:
    """digits-light with golden outputs the model does not produce: fails its smoke test."""
    folder = tmp / "broken" / "1"
    shutil.copytree(MODELS / "digits-light" / "1", folder)
    with np.load(folder / "golden.npz") as golden:
        arrays = {k: golden[k] for k in golden.files}
    arrays["output:probabilities"] = np.roll(arrays["output:probabilities"], 3, axis=1)
    np.savez(folder / "golden.npz", **arrays)
    return folder / "model.int8.tflite"


def big_package(tmp: Path, megabytes: int) -> Path:
    """A valid ONNX package of ``megabytes`` MB, with golden data."""
    return sized_package(tmp / f"big-{megabytes}" / "1", megabytes)


@dataclass
class Device:
    id: str
    bundle: Path
    state: Path
    enrollment: Enrollment


@dataclass
class OtaWorld:
    root: Path
    keys: KeyStore
    repo: OtaRepository
    state: Path
    gateway: GatewayThread
    groups: GroupKeys
    rollouts: RolloutStore
    devices: dict[str, Device] = field(default_factory=dict)
    updaters: list[OtaUpdater] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.gateway.http_url}"

    def enroll(self, device_id: str, group: str = GROUP) -> Device:
        token = DeviceRegistry.add_to(self.gateway.gateway.config.state_url, device_id, group)
        private, _ = self.groups.ensure(group)
        bundle = self.root / f"{device_id}.bundle.json"
        write_bundle(
            bundle, device_id=device_id, group=group, token=token, group_private=private,
            trusted_root=self.repo.root_bytes(), gateway=self.url,
        )  # fmt: skip
        device = Device(device_id, bundle, self.root / "devices" / device_id, load_bundle(bundle))
        self.devices[device_id] = device
        return device

    def publish(self, name: str, version: int, file: Path, groups: list[str] | None = None) -> Any:
        keys = {g: self.groups.ensure(g)[1] for g in (groups or [GROUP])}
        return self.repo.publish(name=name, version=version, model_file=file, groups=keys)

    def release(
        self, name: str, version: int, file: Path, *, percent: float = 100.0, group: str = GROUP
    ) -> Any:
        result = self.publish(name, version, file, [group])
        self.rollouts.start(name, version, group, percent)
        return result

    def updater(
        self,
        device: Device,
        *,
        url: str | None = None,
        profile: str = "raspberry-pi-5",
        hooks: dict[str, Any] | None = None,
        transport: GatewayTransport | None = None,
        **settings: Any,
    ) -> OtaUpdater:
        hooks = dict(hooks or {})
        if transport is not None:
            hooks["client"] = httpx.Client(
                base_url=url or self.url,
                transport=transport,
                headers={"authorization": f"Bearer {device.enrollment.token}"},
            )
        updater = OtaUpdater(
            OtaSettings(state_dir=device.state, url=url or self.url, **settings),
            device.enrollment,
            ProfileStore(PROFILES).get(profile),
            **hooks,
        )
        self.updaters.append(updater)
        return updater

    def cli(self, *args: str) -> str:
        """What ``cloud-gateway ARGS`` prints on this world's state (it must succeed)."""
        state = self.gateway.gateway.config.state_dir
        result = subprocess.run(
            [sys.executable, "-m", "cloud_gateway", "--state-dir", str(state), *args],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result.stdout

    def store(self, device: Device) -> OtaStore:
        return OtaStore(device.state / "ota")

    def data_key(self, name: str, version: int, group: str = GROUP) -> bytes:
        """A published version's data key, unwrapped with the group's key as a device does."""
        info = self.repo.targets()[key_target(group, name, version)]
        directory, _, base = info.path.rpartition("/")
        stored = self.repo.targets_dir / directory / f"{info.hashes['sha256']}.{base}"
        private = self.groups.ensure(group)[0]
        return unwrap_key(
            json.loads(stored.read_text()), private, name=name, version=version, group=group
        )

    def resign(
        self,
        name: str,
        version: int,
        *,
        blob: bytes | None = None,
        length: int | None = None,
        **custom: Any,
    ) -> None:
        """Sign new targets metadata in which ``name`` ``version`` is another ``blob`` (stored
        beside the first), or has another signed ``length`` or other ``custom`` fields: what
        the holder of the targets key can sign (a careless or compromised publisher)."""
        with self.repo._locked():
            targets = self.repo.load("targets")
            info = targets.signed.targets[payload_target(name, version)]
            if blob is not None:
                sha = hashlib.sha256(blob).hexdigest()
                folder = self.repo.targets_dir / "models" / name / str(version)
                (folder / f"{sha}.payload").write_bytes(blob)
                info.length, info.hashes = len(blob), {"sha256": sha}
            if length is not None:
                info.length = length
            info.unrecognized_fields["custom"].update(custom)
            self.repo._commit_targets(targets)

    def reseal(self, name: str, version: int, plaintext: bytes) -> None:
        """Sign ``plaintext`` as the package of ``name`` ``version``: encrypted with its data
        key, its signed plaintext length the true one (see :meth:`resign`)."""
        with tempfile.TemporaryDirectory() as tmp:
            source, blob = Path(tmp) / "plain", Path(tmp) / "blob"
            source.write_bytes(plaintext)
            key = self.data_key(name, version)
            encrypt_file(source, blob, key, name=name, version=version)
            self.resign(name, version, blob=blob.read_bytes(), plaintext_length=len(plaintext))

    def payload_file(self, name: str, version: int) -> Path:
        return next((self.repo.root / "targets" / "models" / name / str(version)).glob("*.payload"))

    def stop(self) -> None:
        for updater in self.updaters:
            updater.close()
        self.gateway.stop()
        self.rollouts.close()


def signed_repository(tmp: Path) -> tuple[KeyStore, OtaRepository]:
    """Fresh signing keys (``tmp/keys``) and an OTA repository signed with them (``tmp/ota``)."""
    keys = KeyStore(tmp / "keys")
    keys.init()
    repo = OtaRepository(tmp / "ota", keys)
    repo.init()
    return keys, repo


def make_world(tmp: Path) -> OtaWorld:
    keys, repo = signed_repository(tmp)
    state = tmp / "gateway-state"
    config = GatewayConfig(
        repository=MODELS, state_dir=state, http_port=0, grpc_port=0, poll_interval_s=0.0,
        ota_repository=tmp / "ota",
    )  # fmt: skip
    # the gateway's own store for the device plan; the test's store writes the same file
    gateway = GatewayThread(config)
    return OtaWorld(
        tmp, keys, repo, state, gateway, GroupKeys(state), RolloutStore(gateway.gateway.database)
    )


class GatewayTransport(httpx.HTTPTransport):
    """The real gateway, seen through a transport that records every request and can
    answer some itself (``answer(request)`` returns a response, or ``None`` to pass):
    a compromised or broken gateway, at the updater's ``client`` seam."""

    def __init__(self, answer: Any = None) -> None:
        super().__init__()
        self.answer = answer
        self.requests: list[tuple[str, str]] = []
        self.ranges: dict[str, list[str | None]] = {}  # path -> the Range of each request

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append((request.method, request.url.path))
        self.ranges.setdefault(request.url.path, []).append(request.headers.get("range"))
        response = self.answer(request) if self.answer is not None else None
        return response if response is not None else super().handle_request(request)

    def blob_requests(self) -> list[str]:
        return [path for _, path in self.requests if "/v2/ota/targets/models/" in path]


class DrippingTransport(GatewayTransport):
    """The real gateway, but the bodies of the first ``times`` requests whose path
    ``drip(path)`` picks trickle out at ``rate`` bytes a second, a few bytes at a time,
    for at most ``for_s`` seconds (then the connection is cut): a slow or hostile
    server, or one behind a link that barely moves. ``dripping`` is set when the first
    such byte goes out."""

    def __init__(
        self, drip: Callable[[str], bool], *, rate: float, for_s: float = 20.0, times: int = 1
    ) -> None:
        super().__init__()
        self.drip = drip
        self.rate = rate
        self.for_s = for_s
        self.times = times
        self.dripping = threading.Event()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if self.times <= 0 or not self.drip(request.url.path):
            return response
        self.times -= 1
        return httpx.Response(
            response.status_code, headers=response.headers, stream=_Drip(self, response)
        )


class _Drip(httpx.SyncByteStream):
    def __init__(self, owner: DrippingTransport, response: httpx.Response) -> None:
        self.owner = owner
        self.response = response

    def __iter__(self) -> Iterator[bytes]:
        started = time.monotonic()
        step = max(1, int(self.owner.rate / 20))  # twenty pieces a second
        for chunk in self.response.stream:
            for offset in range(0, len(chunk), step):
                if time.monotonic() - started > self.owner.for_s:
                    return  # cut short of its Content-Length
                self.owner.dripping.set()
                yield chunk[offset : offset + step]
                time.sleep(step / self.owner.rate)  # the server's pace, not a test's wait

    def close(self) -> None:
        self.response.close()


def plan_answer(body: bytes | Any) -> Any:
    """An ``answer`` for :class:`GatewayTransport` that serves ``body`` as the plan."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()

    def answer(request: httpx.Request) -> httpx.Response | None:
        if request.url.path == "/v2/ota/plan":
            return httpx.Response(200, content=content)
        return None

    return answer


class CuttingProxy:
    """A TCP proxy in front of the gateway that cuts the first blob download after
    ``cut_after`` body bytes and records every request line and its Range header."""

    def __init__(self, upstream: tuple[str, int], cut_after: int) -> None:
        self.upstream = upstream
        self.cut_after = cut_after
        self.requests: list[tuple[str, str | None]] = []
        self.body_bytes = 0  # blob bytes sent to the client, over all connections
        self._cut_done = False
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(16)
        self.port = self._server.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(self.upstream)
        try:
            self._relay(client, upstream)
        except OSError:
            pass  # the client went away (it refused the stream): so does the upstream
        finally:
            client.close()
            upstream.close()

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        while True:
            request = b""
            while b"\r\n\r\n" not in request:
                data = client.recv(65536)
                if not data:
                    return
                request += data
            head = request.split(b"\r\n\r\n", 1)[0].decode(errors="replace")
            lines = head.split("\r\n")
            ranges = next(
                (
                    line.split(":", 1)[1].strip()
                    for line in lines
                    if line.lower().startswith("range:")
                ),
                None,
            )
            self.requests.append((lines[0], ranges))
            upstream.sendall(request)
            blob = "/targets/models/" in lines[0]
            cut = blob and not self._cut_done
            if not self._relay_response(upstream, client, blob, cut):
                return

    def _relay_response(
        self, upstream: socket.socket, client: socket.socket, blob: bool, cut: bool
    ) -> bool:
        response = b""
        while b"\r\n\r\n" not in response:
            data = upstream.recv(65536)
            if not data:
                return False
            response += data
        head, body = response.split(b"\r\n\r\n", 1)
        length = 0
        for line in head.decode(errors="replace").split("\r\n"):
            if line.lower().startswith("content-length:"):
                length = int(line.split(":", 1)[1])
        client.sendall(head + b"\r\n\r\n")
        sent = 0
        while True:
            if cut and sent + len(body) >= self.cut_after:
                client.sendall(body[: self.cut_after - sent])
                if blob:
                    self.body_bytes += self.cut_after - sent
                self._cut_done = True
                return False  # cut: close the connection halfway
            client.sendall(body)
            sent += len(body)
            if blob:
                self.body_bytes += len(body)
            if sent >= length:
                return True
            body = upstream.recv(65536)
            if not body:
                return False

    def close(self) -> None:
        self._server.close()


def compress(body: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.compress(body, 6)
    if encoding == "deflate":
        return zlib.compress(body)
    brotli = importlib.import_module("brotli")  # only where installed: httpx decodes br only then
    return bytes(brotli.compress(body, quality=5))


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that refuses an answer hangs up while it is being sent: expected here."""


class EncodingServer:
    """A real HTTP server on loopback that answers with compressed bodies whatever the
    client asks for (a misconfigured gateway, or a hostile proxy in front of one).

    ``answer(path)`` gives the body of a path as sent, compressed already (see
    :func:`compress`), or ``None`` for an unencoded 404; it goes out with
    ``Content-Encoding: encoding`` (none when ``None``), with a ``Content-Length``
    unless ``declare_length`` is false. Each request's ``Accept-Encoding`` is
    recorded in :attr:`accepted`."""

    def __init__(
        self,
        answer: Callable[[str], bytes | None],
        encoding: str | None = "gzip",
        *,
        declare_length: bool = True,
    ) -> None:
        self.accepted: list[str | None] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.accepted.append(self.headers.get("accept-encoding"))
                body = answer(self.path)
                if body is None:
                    self.send_response(404)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                if encoding is not None:
                    self.send_header("content-encoding", encoding)
                if declare_length:  # else the body ends when the connection closes
                    self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


PROFILE = ProfileStore(PROFILES).get("raspberry-pi-5")


def assert_serves(
    world: OtaWorld, device: Device, version: int, name: str = "digits-light"
) -> None:
    """The device's active model is ``version``, complete, and passes its smoke test."""
    store = world.store(device)
    active = store.active(name)
    assert active is not None and active.version == version
    package = store.package(name, device.enrollment.group, device.enrollment.group_key)
    assert package.version == version
    smoke_test(package, PROFILE)


def first_install(world: OtaWorld) -> Device:
    device = world.enroll("cam-01")
    world.release("digits-light", 2, LIGHT_INT8)
    outcomes = world.updater(device).check()
    assert [(o.name, o.version, o.status) for o in outcomes] == [("digits-light", 2, "installed")]
    assert_serves(world, device, 2)
    status, detail = world.rollouts.device_report(device.id, "digits-light", 2) or ("", "")
    assert status == "installed" and detail.startswith("smoke test passed: tflite-int8"), detail
    return device


INSTALLER = Path(__file__).parent / "ota_installer.py"


def run_installer(device: Device, url: str, *options: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(INSTALLER), str(device.bundle), str(device.state), url]
    return subprocess.run(
        [*command, *options], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


@pytest.fixture
def world(tmp_path: Path) -> Iterator[OtaWorld]:
    """A world of its own for a test (through ``pytest_plugins``)."""
    w = make_world(tmp_path)
    yield w
    w.stop()
