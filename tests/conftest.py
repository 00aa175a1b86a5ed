"""Shared fixtures: the model repository, fetched third-party models, fake device roots."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from edge_agent.profiles import ProfileStore
from edge_core.package import ModelRepository

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"
PROFILES = ROOT / "device_profiles"

ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU part\t: 0xd0b

processor\t: 1
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU part\t: 0xd0b
"""

X86_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum
flags\t\t: fpu vme sse sse2 avx avx2 avx512f avx512bw avx512_vnni
"""


def make_root(
    base: Path,
    *,
    model: str | None = None,
    compatible: Sequence[str] = (),
    tegra: str | None = None,
    cpuinfo: str = ARM_CPUINFO,
    cpus: int = 0,
    governors: str = "conservative ondemand userspace powersave performance schedutil",
    temperatures: dict[int, int] | None = None,
) -> Path:
    """A fake filesystem root with the files detection and power control read."""
    (base / "proc").mkdir(parents=True, exist_ok=True)
    (base / "proc/cpuinfo").write_text(cpuinfo)
    (base / "proc/meminfo").write_text("MemTotal:        8000000 kB\n")
    if model is not None or compatible:
        tree = base / "proc/device-tree"
        tree.mkdir(parents=True, exist_ok=True)
        if model is not None:
            (tree / "model").write_bytes(model.encode() + b"\x00")
        if compatible:
            (tree / "compatible").write_bytes(
                b"\x00".join(c.encode() for c in compatible) + b"\x00"
            )
    if tegra is not None:
        (base / "etc").mkdir(exist_ok=True)
        (base / "etc/nv_tegra_release").write_text(tegra)
    for index in range(cpus):
        freq = base / f"sys/devices/system/cpu/cpu{index}/cpufreq"
        freq.mkdir(parents=True)
        (freq / "scaling_governor").write_text("ondemand\n")
        (freq / "scaling_available_governors").write_text(governors + "\n")
        (freq / "cpuinfo_min_freq").write_text("600000\n")
        (freq / "cpuinfo_max_freq").write_text("2400000\n")
        (freq / "scaling_max_freq").write_text("2400000\n")
    for zone, millidegrees in (temperatures or {}).items():
        path = base / f"sys/class/thermal/thermal_zone{zone}"
        path.mkdir(parents=True, exist_ok=True)
        (path / "temp").write_text(f"{millidegrees}\n")
    return base


@pytest.fixture(scope="session")
def repository() -> ModelRepository:
    return ModelRepository(MODELS)


@pytest.fixture(scope="session")
def profiles() -> ProfileStore:
    return ProfileStore(PROFILES)


@pytest.fixture(scope="session")
def fetched(repository: ModelRepository) -> ModelRepository:
    """The repository with the third-party models fetched into it (once, then cached)."""
    wanted = ("face-detection-short-range", "face-detection-full-range", "ppocr-det")
    if any(not repository.versions(name) for name in wanted):
        subprocess.run([sys.executable, str(ROOT / "tools/fetch_models.py")], check=True)
    return repository


# -- the gateway ------------------------------------------------------------------------


class GatewayHandle:
    """A real gateway (uvicorn + grpc.aio) on free loopback ports, and tokens for it."""

    def __init__(self, thread, device_token: str, admin_token: str, state_dir: Path) -> None:  # type: ignore[no-untyped-def]
        self.thread = thread
        self.gateway = thread.gateway
        self.device_token = device_token
        self.admin_token = admin_token
        self.state_dir = state_dir

    @property
    def http_url(self) -> str:
        return self.thread.http_url

    @property
    def grpc_url(self) -> str:
        return self.thread.grpc_url

    def headers(self, token: str | None = None) -> dict[str, str]:
        """Fresh headers (tritonclient adds to the dict it is given)."""
        return {"authorization": f"Bearer {token or self.device_token}"}


def start_gateway(tmp: Path, repository: Path, backend=None, **overrides) -> GatewayHandle:  # type: ignore[no-untyped-def]
    from cloud_gateway import GatewayConfig, GatewayThread
    from cloud_gateway.auth import DeviceRegistry

    config = GatewayConfig(repository=repository, state_dir=tmp / "state", http_port=0, grpc_port=0)
    config = dataclasses.replace(config, **overrides)
    registry = DeviceRegistry(config.devices_file)
    device_token = registry.add("cam-01", "rpi5-int8")
    admin_token = registry.add("ops", "operators", role="admin")
    return GatewayHandle(
        GatewayThread(config, backend=backend), device_token, admin_token, config.state_dir
    )


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, fetched: ModelRepository):  # type: ignore[no-untyped-def]
    """A gateway serving the sample and fetched models (read-only: do not change it)."""
    handle = start_gateway(tmp_path_factory.mktemp("gateway"), MODELS, poll_interval_s=0.0)
    yield handle
    handle.thread.stop()
