"""What a device carries, per class of profile: the installed size on disk and the idle
agent's memory (issue 30's footprint table, docs/install.md).

    python tools/footprint.py                     # the table; bench-results/footprint.json
    python tools/footprint.py --aarch64           # and the sizes a 64-bit Pi installs

Each class is the wheel of this checkout (built as ``make wheel`` builds it) installed
with the class's extras into a fresh virtual environment of this interpreter, from the
package registry (pip's cache): the size is every file under its ``site-packages`` as
``du`` counts it (blocks on disk, the ``.pyc`` files pip compiles included). The
environment is made without pip, so pip and setuptools are not counted (this pip
installs into it; a device's own venv adds about 15 MB of them). Then ``edge-agent
run`` is started from that environment as systemd starts it (from ``/``, nothing of the
checkout on its path, ``NOTIFY_SOCKET`` set), on a fake device root, with one INT8
model (digits-light) and everything the class enables, the face detectors the wheel
ships among it; ``VmRSS`` is read from ``/proc`` a few seconds after ``READY=1``
(the median of ``--starts``), each start with the environment's files out of the page
cache, as after a device's boot (:func:`evict`), and ``/proc/PID/maps`` says which
heavy libraries it loaded. With ``--aarch64`` the same extras are installed again for
aarch64 (manylinux up to glibc 2.36) and CPython 3.11, Raspberry Pi OS bookworm's, with
``pip install --platform --target`` (tools/device_wheels.py, whose tags ``make
test-arm64`` checks against the emulated device's pip): measured, not run.

The full class talks to a gateway (``cloud-gateway serve`` from this environment) and a
Mosquitto on loopback, so it needs this checkout's dev environment and ``mosquitto``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_core.errors import EdgeError
from edge_core.processes import free_port, stop_process
from edge_core.report import machine_info, publish, render_table
from tools.device_wheels import install_for, pip

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench-results" / "footprint.json"
DISK_TARGET_MB, RSS_TARGET_MB = 200.0, 80.0
# the libraries whose memory matters, as their shared objects appear in /proc/PID/maps
HEAVY = {"ai_edge_litert": "LiteRT", "onnxruntime": "ONNX Runtime", "cv2": "OpenCV",
         "PIL": "Pillow", "grpc": "grpc"}  # fmt: skip
CLEAN = {"PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1"}


@dataclass(frozen=True)
class ProfileClass:
    """A kind of device: the extras it installs, the profile it runs, what it enables."""

    name: str
    extras: str
    profile: str
    what: str
    everything: bool = False  # the local gRPC API, offload, MQTT and telemetry on too


CLASSES = (
    ProfileClass("litert", "litert", "raspberry-pi-5",
                 "LiteRT only: INT8 TFLite, pictures, the privacy path"),
    ProfileClass("onnx", "onnx", "generic-x86_64",
                 "ONNX Runtime only: INT8 ONNX, pictures, the privacy path"),
    ProfileClass("full", "device", "raspberry-pi-5",
                 "everything: both runtimes, video, gRPC API, offload, OTA, MQTT, telemetry",
                 everything=True),
)  # fmt: skip


# -- sizes ---------------------------------------------------------------------------------


def _records(folder: Path) -> dict[Path, str]:
    """Each file a distribution under ``folder`` installed (its RECORD), to its name."""
    owners = {}
    for record in folder.glob("*.dist-info/RECORD"):
        name = record.parent.name.split("-")[0].lower().replace("_", "-")
        for line in record.read_text(errors="replace").splitlines():
            path = line.rsplit(",", 2)[0]
            if path:
                owners[(folder / path).resolve()] = name
    return owners


def disk_usage(folder: Path) -> tuple[int, dict[str, int]]:
    """Bytes on disk under ``folder`` (blocks, as ``du``; a hard-linked file once), and
    by distribution (``other``: files no RECORD names)."""
    owners = _records(folder)
    seen: set[tuple[int, int]] = set()
    total, by_name = 0, dict[str, int]()
    for directory, _, files in os.walk(folder):
        for file in files:
            path = Path(directory) / file
            info = path.lstat()
            if (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
            used = info.st_blocks * 512
            total += used
            owner = owners.get(path.resolve(), "other")
            by_name[owner] = by_name.get(owner, 0) + used
    return total, by_name


def build_wheel(out: Path) -> Path:
    """This checkout's wheel, as ``make wheel`` builds it."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
         str(out), str(ROOT)],
        check=True,
    )  # fmt: skip
    (wheel,) = out.glob("edge_inference-*.whl")
    return wheel


def make_venv(folder: Path, wheel: Path, extras: str) -> Path:
    """A fresh virtual environment of this interpreter with ``wheel[extras]``, made without
    pip (this one installs into it); its ``site-packages``.

    Raises:
        EdgeError: pip failed.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    pip("--python", str(folder / "bin" / "python"), "install", f"{wheel}[{extras}]")
    (site,) = folder.glob("lib/python*/site-packages")
    return site


# -- the agent ------------------------------------------------------------------------------


def fake_root(base: Path) -> Path:
    """Two CPUs with cpufreq and one thermal zone at 50 C: a board the profiles accept."""
    from benchmarks.agent.service_daemon import fake_root as make

    return make(base)


def agent_config(
    tmp: Path, profile: str, models: Path, http_port: int, *, grpc_port: int = 0,
    extra: str = "", faces: bool = True,
) -> Path:  # fmt: skip
    """A configuration with ``models`` as its one model folder and, with ``faces``, the
    privacy path's face detector (the one the profile picks, from the wheel) loaded."""
    config = tmp / "agent.toml"
    config.write_text(
        f'device_id = "footprint"\nprofile = "{profile}"\nroot = "{fake_root(tmp / "root")}"\n'
        f'model_dir = "{models}"\nstate_dir = "{tmp / "state"}"\n'
        f"[privacy]\nface_detector = {str(faces).lower()}\n"
        f"[api]\nhttp_port = {http_port}\ngrpc_port = {grpc_port}\ndrain_s = 2\n"
        f"[thermal]\ninterval_s = 1\n{extra}"
    )
    return config


@contextlib.contextmanager
def started(python: Path, config: Path, tmp: Path, timeout: float = 120) -> Iterator[int]:
    """``python -m edge_agent run --config config`` as systemd starts it, until
    ``READY=1``; its pid.

    Raises:
        EdgeError: it exited, or was not ready within ``timeout``.
    """
    path = tmp / f"notify-{time.monotonic_ns()}.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(path))
    notify.settimeout(0.5)
    log = path.with_suffix(".log")
    with log.open("wb") as err:
        process = subprocess.Popen(
            [str(python), "-m", "edge_agent", "run", "--config", str(config)], cwd="/",
            env={**CLEAN, "NOTIFY_SOCKET": str(path)}, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    try:
        end, said = time.monotonic() + timeout, ""
        while "READY=1" not in said.splitlines():
            if process.poll() is not None or time.monotonic() > end:
                tail = log.read_text(errors="replace")[-3000:]
                raise EdgeError(f"the agent did not get ready: {tail}")
            with contextlib.suppress(TimeoutError):
                said += notify.recv(4096).decode(errors="replace") + "\n"
        yield process.pid
    finally:
        stop_process(process, 30)
        notify.close()
        path.unlink(missing_ok=True)


def evict(folder: Path) -> None:
    """``folder``'s files out of the page cache (``POSIX_FADV_DONTNEED``, these files
    only): a start after the install would find them all cached, and the kernel maps
    cached pages around each fault, so file-backed RSS would count what a device,
    started after its boot, never reads."""
    for directory, _, files in os.walk(folder):
        for file in files:
            try:
                descriptor = os.open(Path(directory) / file, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(descriptor)


def vm_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024.0, 1)
    raise EdgeError(f"no VmRSS for {pid}")


def loaded_libraries(pid: int) -> list[str]:
    """Which of :data:`HEAVY` the process has mapped (their shared objects)."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return [name for key, name in HEAVY.items() if f"/site-packages/{key}" in maps]


def loaded_variants(http_port: int) -> dict[str, str]:
    """``model -> variant`` from the agent's /metrics (``edge_agent_model_loaded``)."""
    url = f"http://127.0.0.1:{http_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    out = {}
    for labels in re.findall(r"^edge_agent_model_loaded\{(.*)\} 1\.0$", text, re.M):
        values = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        out[values["model"]] = values["variant"]
    return out


@contextlib.contextmanager
def everything(tmp: Path) -> Iterator[str]:
    """A gateway to offload to (HTTP) and a Mosquitto for MQTT and telemetry, on
    loopback; the configuration's lines for them."""
    from benchmarks.agent.hybrid import gateway_process
    from benchmarks.agent.mosquitto import Mosquitto

    served = tmp / "served"
    served.mkdir()
    (served / "digits-light").symlink_to(ROOT / "models" / "digits-light")
    with contextlib.ExitStack() as stack:
        gateway = stack.enter_context(gateway_process(served, tmp / "gateway"))
        token = tmp / "device.token"
        token.write_text(gateway["token"] + "\n")
        token.chmod(0o600)
        broker = Mosquitto(tmp / "broker")
        broker.start()
        stack.callback(broker.stop)
        yield (
            f'[gateway]\nprotocol = "http"\naddress = "{gateway["http"]}"\n'
            f'token_file = "{token}"\n'
            f'[mqtt]\nhost = "127.0.0.1"\nport = {broker.port}\n[telemetry]\ninterval_s = 5\n'
        )


def measure_rss(
    venv: Path, kind: ProfileClass, tmp: Path, *, starts: int, idle_s: float
) -> dict[str, Any]:
    """The idle agent of ``kind`` from ``venv``, without and with the face detector: the
    median VmRSS over ``starts`` each, and what it loaded."""
    models = tmp / "models"
    models.mkdir()
    shutil.copytree(ROOT / "models" / "digits-light", models / "digits-light")
    out: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        extra = stack.enter_context(everything(tmp)) if kind.everything else ""
        for faces, key in ((False, "rss_mb"), (True, "rss_faces_mb")):
            samples = []
            for index in range(starts):
                run = tmp / f"run-{key}-{index}"
                run.mkdir()
                port = free_port()
                grpc_port = free_port() if kind.everything else 0
                config = agent_config(run, kind.profile, models, port, grpc_port=grpc_port,
                                      extra=extra, faces=faces)  # fmt: skip
                evict(venv)
                with started(venv / "bin" / "python", config, run) as pid:
                    time.sleep(idle_s)
                    samples.append(vm_rss_mb(pid))
                    out["libraries"] = loaded_libraries(pid)
                    out["variants"] = loaded_variants(port)
            out[key] = statistics.median(samples)
            out[f"{key.removesuffix('_mb')}_samples_mb"] = samples
    return out


# -- the run --------------------------------------------------------------------------------


def measure(
    *, starts: int = 3, idle_s: float = 3.0, rss: bool = True, aarch64: bool = False,
    wheel: Path | None = None, classes: tuple[ProfileClass, ...] = CLASSES,
) -> dict[str, Any]:  # fmt: skip
    """Every class's sizes (and RSS, and aarch64 sizes), as a report."""
    report: dict[str, Any] = {
        "benchmark": "footprint",
        "targets": {"litert_disk_mb": DISK_TARGET_MB, "idle_rss_mb": RSS_TARGET_MB},
        "counted": "site-packages as du counts it, .pyc included, pip and setuptools not",
        "classes": {},
        "machine": machine_info(),
    }
    with tempfile.TemporaryDirectory(prefix="footprint-") as name:
        tmp = Path(name)
        wheel = wheel or build_wheel(tmp / "dist")
        report["wheel"] = wheel.name
        for kind in classes:
            folder = tmp / kind.name
            site = make_venv(folder / "venv", wheel, kind.extras)
            total, by_name = disk_usage(site)
            row: dict[str, Any] = {
                "extras": kind.extras, "profile": kind.profile, "what": kind.what,
                "disk_mb": _mb(total), "by_distribution_mb": _largest(by_name),
            }  # fmt: skip
            if aarch64:
                target = install_for(folder / "aarch64", [f"{wheel}[{kind.extras}]"])
                arm_total, arm_by_name = disk_usage(target)
                row["aarch64_disk_mb"] = _mb(arm_total)
                row["aarch64_by_distribution_mb"] = _largest(arm_by_name)
            if rss:
                row.update(measure_rss(folder / "venv", kind, folder, starts=starts,
                                       idle_s=idle_s))  # fmt: skip
            report["classes"][kind.name] = row
    return report


def _mb(size: int) -> float:
    return round(size / 1e6, 1)


def _largest(by_name: dict[str, int], count: int = 8) -> dict[str, float]:
    ranked = sorted(by_name.items(), key=lambda item: -item[1])
    return {name: _mb(size) for name, size in ranked[:count]}


def format_report(report: dict[str, Any]) -> str:
    rows = []
    for name, row in report["classes"].items():
        disk = row["disk_mb"]
        arm = row.get("aarch64_disk_mb")
        rows.append([
            name, f"[{row['extras']}]", row["profile"], disk, "-" if arm is None else arm,
            row.get("rss_mb", "-"), row.get("rss_faces_mb", "-"),
            ", ".join(row.get("libraries", [])) or "-",
            ", ".join(f"{m}: {v}" for m, v in row.get("variants", {}).items()) or "-",
        ])  # fmt: skip
    headers = ["class", "extras", "profile", "disk MB x86_64", "disk MB aarch64",
               "idle RSS MB", "+ face detector", "libraries loaded", "models loaded"]  # fmt: skip
    lines = [
        render_table(headers, rows),
        f"disk: {report['counted']}; idle RSS: VmRSS a few seconds after READY=1, the median "
        "of starts, one INT8 model (digits-light) and all the class enables; + face "
        "detector: the privacy path's CenterFace (and its checker) loaded too",
    ]
    for name, row in report["classes"].items():
        lines.append(f"{name}: {row['what']}")
        for arch in ("x86_64", "aarch64"):
            key = "by_distribution_mb" if arch == "x86_64" else "aarch64_by_distribution_mb"
            if key in row:
                largest = ", ".join(f"{k} {v}" for k, v in row[key].items())
                lines.append(f"  largest on {arch}, MB: {largest}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--json", type=Path, default=RESULTS, help="where the report goes")
    parser.add_argument("--wheel", type=Path, help="a wheel already built (default: build one)")
    parser.add_argument("--starts", type=int, default=3, help="agent starts per class")
    parser.add_argument("--idle-s", type=float, default=3.0, help="after READY=1, before VmRSS")
    parser.add_argument("--no-rss", action="store_true", help="sizes only")
    parser.add_argument("--aarch64", action="store_true", help="also the sizes for a 64-bit Pi")
    names = [c.name for c in CLASSES]
    parser.add_argument("--class", dest="only", action="append", choices=names,
                        help="only this class (repeatable)")  # fmt: skip
    args = parser.parse_args(argv)
    chosen = tuple(c for c in CLASSES if not args.only or c.name in args.only)
    try:
        report = measure(starts=args.starts, idle_s=args.idle_s, rss=not args.no_rss,
                         aarch64=args.aarch64, wheel=args.wheel, classes=chosen)  # fmt: skip
    except EdgeError as exc:
        print(f"footprint: {exc}", file=sys.stderr)
        return 1
    publish(format_report(report), report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
