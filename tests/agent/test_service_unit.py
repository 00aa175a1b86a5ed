"""The agent under systemd: the notify protocol against a real datagram socket, the
watchdog's rhythm, the unit as `systemd-analyze` reads it, and `edge-agent service install`."""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_agent.cli import main
from edge_agent.service.notify import Notifier
from edge_agent.service.unit import (
    DEFAULT_GROUPS,
    UnitError,
    _group_exists,
    install_unit,
    render_unit,
)
from edge_core.errors import ConfigError


def host_groups() -> str:
    """The accelerator groups of this host now (a group it lacks is left out of the unit;
    read when a test runs: an install meanwhile may add one)."""
    return " ".join(group for group in DEFAULT_GROUPS if _group_exists(group))


CONFIG = Path("/etc/edge-agent/agent.toml")


class Receiver:
    """systemd's end of NOTIFY_SOCKET: a bound datagram socket that collects messages."""

    def __init__(self, sock: socket.socket, address: str) -> None:
        self.sock = sock
        self.address = address  # as NOTIFY_SOCKET spells it

    def messages(self, seconds: float) -> list[dict[str, str]]:
        """Every message that arrives within ``seconds``, parsed into its fields."""
        deadline = time.monotonic() + seconds
        received = []
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                break
            received.append(dict(line.split("=", 1) for line in data.decode().split("\n")))
        return received

    def one(self) -> dict[str, str]:
        self.sock.settimeout(2.0)
        data = self.sock.recv(4096).decode()
        return dict(line.split("=", 1) for line in data.split("\n"))


@pytest.fixture(params=["path", "abstract"])
def receiver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Receiver]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if request.param == "path":
        address = str(tmp_path / "notify.sock")
        sock.bind(address)
    else:
        name = f"edge-agent-test-{uuid.uuid4().hex}"
        sock.bind("\0" + name)
        address = "@" + name
    with sock:
        yield Receiver(sock, address)


def pings(messages: list[dict[str, str]]) -> int:
    return sum(1 for message in messages if message == {"WATCHDOG": "1"})


# --- the notify protocol -------------------------------------------------------------------


def test_lifecycle_messages_reach_the_socket(receiver: Receiver) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": receiver.address})
    assert notifier.enabled

    assert notifier.ready("serving digits-light")
    assert receiver.one() == {"READY": "1", "STATUS": "serving digits-light"}
    assert notifier.status("loading 2 models")
    assert receiver.one() == {"STATUS": "loading 2 models"}

    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert notifier.reloading()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    message = receiver.one()
    assert message.keys() == {"RELOADING", "MONOTONIC_USEC"} and message["RELOADING"] == "1"
    assert before <= int(message["MONOTONIC_USEC"]) <= after
    assert notifier.reloaded()
    assert receiver.one() == {"READY": "1"}

    assert notifier.extend_timeout(90)
    assert receiver.one() == {"EXTEND_TIMEOUT_USEC": "90000000"}
    assert notifier.stopping()
    assert receiver.one() == {"STOPPING": "1"}


def test_status_text_cannot_smuggle_fields(receiver: Receiver) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": receiver.address})
    notifier.status("model 'x\nREADY=1'")
    assert receiver.one() == {"STATUS": "model 'x READY=1'"}


def test_without_systemd_everything_is_a_no_op() -> None:
    notifier = Notifier({})
    assert not notifier.enabled and notifier.watchdog_interval is None
    assert not notifier.ready() and not notifier.stopping() and not notifier.watchdog()
    assert not notifier.start_watchdog(lambda: True)
    notifier.stop()


def test_a_vanished_socket_is_logged_once_never_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert not notifier.ready()
    assert not notifier.status("still here")
    assert not notifier.watchdog()
    warnings = [r for r in caplog.records if r.name == "edge_agent.service.notify"]
    assert len(warnings) == 1 and "gone.sock" in warnings[0].getMessage()


@pytest.mark.parametrize(
    ("environ", "field"),
    [
        ({"NOTIFY_SOCKET": "vsock:2:1234"}, "NOTIFY_SOCKET"),
        ({"NOTIFY_SOCKET": "relative.sock"}, "NOTIFY_SOCKET"),
        ({"NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_USEC": "soon"}, "WATCHDOG_USEC"),
        ({"NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_USEC": "0"}, "WATCHDOG_USEC"),
        ({"NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_PID": "-1"}, "WATCHDOG_PID"),
    ],
)
def test_a_malformed_environment_fails_at_start(environ: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError, match="expected") as info:
        Notifier(environ)
    assert info.value.field == field


# --- the watchdog ---------------------------------------------------------------------------


@pytest.mark.slow
def test_watchdog_pings_at_half_the_interval_while_healthy(receiver: Receiver) -> None:
    env = {"NOTIFY_SOCKET": receiver.address, "WATCHDOG_USEC": "200000"}
    healthy = threading.Event()
    healthy.set()
    with Notifier(env, pid=os.getpid()) as notifier:
        assert notifier.watchdog_interval == pytest.approx(0.1)
        assert notifier.start_watchdog(healthy.is_set)
        with pytest.raises(RuntimeError, match="already running"):
            notifier.start_watchdog(healthy.is_set)
        # one ping at once, then one every 0.1 s: about 7 in 0.6 s (a busy machine may
        # delay one or two)
        assert 3 <= pings(receiver.messages(0.6)) <= 10

        healthy.clear()
        receiver.messages(0.3)  # a ping already under way may still land
        assert pings(receiver.messages(0.5)) == 0

        healthy.set()
        assert pings(receiver.messages(0.6)) >= 2
    assert pings(receiver.messages(0.3)) == 0  # stopped by the with block


def test_a_health_check_that_raises_counts_as_unhealthy(receiver: Receiver) -> None:
    def broken() -> bool:
        raise OSError("wedged")

    with Notifier({"NOTIFY_SOCKET": receiver.address, "WATCHDOG_USEC": "100000"}) as notifier:
        assert notifier.start_watchdog(broken)
        assert pings(receiver.messages(0.3)) == 0


def test_watchdog_of_another_process_is_not_ours(receiver: Receiver) -> None:
    env = {
        "NOTIFY_SOCKET": receiver.address,
        "WATCHDOG_USEC": "100000",
        "WATCHDOG_PID": str(os.getpid() + 1),
    }
    with Notifier(env, pid=os.getpid()) as notifier:
        assert notifier.watchdog_interval is None
        assert not notifier.start_watchdog(lambda: True)
        assert receiver.messages(0.3) == []
    mine = Notifier({**env, "WATCHDOG_PID": str(os.getpid())})
    assert mine.watchdog_interval == pytest.approx(0.05)


# --- the unit -------------------------------------------------------------------------------


def analyze(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    return subprocess.run(
        ["systemd-analyze", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def our_complaints(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The lines about our unit (the host's own units may draw warnings of their own)."""
    return [line for line in result.stderr.splitlines() if "edge-agent.service" in line]


def visible_python() -> str:
    """An interpreter outside what the sandbox hides (verify wants ExecStart's binary
    to exist; this checkout and its virtual environment may be under /tmp or /root)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    pytest.skip("no python3 in /usr/bin or /usr/local/bin for ExecStart")


@pytest.mark.parametrize("user", [None, "edge", "root"])
def test_systemd_accepts_the_unit(tmp_path: Path, user: str | None) -> None:
    unit = tmp_path / "edge-agent.service"
    unit.write_text(render_unit(visible_python(), CONFIG, user, groups=["apex"]))
    result = analyze("verify", str(unit), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert our_complaints(result) == []


def test_verify_would_catch_a_bad_setting(tmp_path: Path) -> None:
    """The check above means something: a broken line in the same unit is reported."""
    unit = tmp_path / "edge-agent.service"
    text = render_unit(visible_python(), CONFIG, None)
    unit.write_text(text.replace("DevicePolicy=closed", "DevicePolicy=sealed"))
    assert any(
        "sealed" in line for line in our_complaints(analyze("verify", str(unit), cwd=tmp_path))
    )


def test_the_sandbox_scores_well(tmp_path: Path) -> None:
    unit = tmp_path / "edge-agent.service"
    unit.write_text(render_unit(visible_python(), CONFIG, None))
    result = analyze("security", "--offline=true", "--no-pager", str(unit), cwd=tmp_path)
    if result.returncode != 0 and "offline" in result.stderr:
        pytest.skip("this systemd-analyze cannot assess a unit file offline (systemd < 250)")
    match = re.search(r"Overall exposure level for edge-agent\.service: ([0-9.]+)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= 3.0  # "OK"; without the sandbox it is 9.6 "UNSAFE"


def test_unit_settings() -> None:
    text = render_unit("/opt/edge/venv/bin/python", CONFIG, None)
    lines = set(text.splitlines())
    assert (
        "ExecStart=/opt/edge/venv/bin/python -m edge_agent run --config /etc/edge-agent/agent.toml"
        in lines
    )
    assert {
        "Type=notify",
        "NotifyAccess=main",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "WatchdogSec=30",
        "Restart=on-failure",
        "DynamicUser=yes",
        "CapabilityBoundingSet=",
        f"SupplementaryGroups={host_groups()}",
        "ReadWritePaths=/sys/devices/system/cpu",
        "DevicePolicy=closed",
        "DeviceAllow=char-drm rw",
        "Environment=PYTHONUNBUFFERED=1",
    } <= lines
    assert "ProtectKernelTunables=yes" not in lines and "PrivateDevices=yes" not in lines
    assert not re.search(r"\{\w+\}", text)  # every placeholder filled

    named = set(
        render_unit("/usr/bin/python3", CONFIG, "edge", groups=["apex", "video"]).splitlines()
    )
    assert {
        "User=edge",
        "CapabilityBoundingSet=",
        f"SupplementaryGroups={host_groups()} apex",
    } <= named
    assert "DynamicUser=yes" not in named
    root = set(render_unit("/usr/bin/python3", CONFIG, "root").splitlines())
    assert "User=root" in root and "CapabilityBoundingSet=" not in root  # power modes


def test_paths_systemd_would_misread_are_escaped(tmp_path: Path) -> None:
    text = render_unit("/opt/edge agent/100%/bin/python", Path("/etc/edge $HOME/a;b.toml"), None)
    line = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert line == (
        'ExecStart="/opt/edge agent/100%%/bin/python" -m edge_agent run '
        '--config "/etc/edge $$HOME/a;b.toml"'
    )
    # systemd reads the executable back as it was given
    unit = tmp_path / "edge-agent.service"
    unit.write_text(text)
    complaints = our_complaints(analyze("verify", str(unit), cwd=tmp_path))
    assert any("/opt/edge agent/100%/bin/python is not executable" in c for c in complaints), (
        complaints
    )


@pytest.mark.parametrize(
    ("python", "config", "user", "message"),
    [
        ("bin/python", CONFIG, None, "is relative"),
        ("/home/pi/venv/bin/python", CONFIG, None, "under /home"),
        ("/usr/bin/python3", Path("/tmp/agent.toml"), None, "under /tmp"),
        ("/usr/bin/python3", Path("/root/agent.toml"), None, "under /root"),
        ('/opt/"edge"/bin/python', CONFIG, None, "quotes or backslashes"),
        ("/opt/edge\n/bin/python", CONFIG, None, "control characters"),
        ("/usr/bin/python3", CONFIG, "edge agent", "user name 'edge agent' is not valid"),
        ("/usr/bin/python3", CONFIG, "-rf", "user name '-rf' is not valid"),
    ],
)
def test_render_refuses_what_would_fail_at_start(
    python: str, config: Path, user: str | None, message: str
) -> None:
    with pytest.raises(UnitError, match=re.escape(message)):
        render_unit(python, config, user)


def test_install_writes_0644_atomically_and_replaces(tmp_path: Path) -> None:
    old_umask = os.umask(0o077)  # the mode must not depend on the installer's umask
    try:
        target = install_unit("[Unit]\nDescription=one\n", tmp_path, dry_run=False)
        target = install_unit("[Unit]\nDescription=two\n", tmp_path, dry_run=False)
    finally:
        os.umask(old_umask)
    assert target == tmp_path / "edge-agent.service"
    assert target.read_text() == "[Unit]\nDescription=two\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["edge-agent.service"]  # no temp files left


def test_install_errors_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(UnitError, match="does not exist; expected systemd's unit directory"):
        install_unit("x", tmp_path / "missing", dry_run=True)
    if os.geteuid() == 0:
        return  # root writes anywhere: no permission error to see
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    with pytest.raises(UnitError, match="permission denied; run the install as root"):
        install_unit("x", locked, dry_run=False)


# --- the command line -----------------------------------------------------------------------


def test_cli_dry_run_prints_the_unit_and_the_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["service", "install", "--dry-run", "--unit-dir", str(tmp_path)]
    assert main([*argv, "--python", "/opt/edge/venv/bin/python", "--group", "apex"]) == 0
    out = capsys.readouterr().out
    assert (
        "ExecStart=/opt/edge/venv/bin/python -m edge_agent run --config /etc/edge-agent/agent.toml"
        in out
    )
    assert f"SupplementaryGroups={host_groups()} apex" in out
    for command in (
        "systemctl daemon-reload",
        "systemctl enable --now edge-agent.service",
        "systemctl status edge-agent.service",
        "journalctl -u edge-agent -f",
    ):
        assert f"#   {command}" in out
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing


def test_a_dry_run_prints_the_unit_with_what_an_install_refuses_as_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The obvious first try (the checkout's .venv under /root, a config in /tmp): the
    dry run shows the unit and says what is wrong; the install refuses it."""
    argv = ["service", "install", "--unit-dir", str(tmp_path), "--config", "/tmp/agent.toml"]
    python = "/root/venv/bin/python"
    assert main([*argv, "--dry-run", "--python", python]) == 0
    captured = capsys.readouterr()
    assert f"ExecStart={python} -m edge_agent run --config /tmp/agent.toml" in captured.out
    warnings = [line for line in captured.err.splitlines() if "warning:" in line]
    assert len(warnings) == 2, captured.err
    assert "is under /root" in warnings[0] and "is under /tmp" in warnings[1]
    assert all("docs/install.md" in w and "an install would refuse it" in w for w in warnings)
    assert main([*argv, "--python", python]) == 1
    assert "is under /root" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_cli_install_writes_the_unit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["service", "install", "--unit-dir", str(tmp_path), "--user", "edge"]
    assert (
        main(
            [*argv, "--python", "/opt/edge/venv/bin/python", "--config", "/etc/edge-agent/cam.toml"]
        )
        == 0
    )
    unit = tmp_path / "edge-agent.service"
    assert stat.S_IMODE(unit.stat().st_mode) == 0o644
    text = unit.read_text()
    assert "User=edge" in text and "--config /etc/edge-agent/cam.toml" in text
    out = capsys.readouterr().out
    assert f"wrote {unit}" in out
    assert "systemctl enable --now edge-agent.service" in out
    assert "journalctl -u edge-agent -f" in out


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["service", "install", "--unit-dir", str(tmp_path), "--python", "/opt/edge/bin/python"]
    assert main([*argv, "--config", "/home/pi/agent.toml"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        "edge-agent: error: the configuration (--config) /home/pi/agent.toml is under /home"
    )
    assert main([*argv[:3], "/nonexistent/units", *argv[4:]]) == 1
    assert "unit directory /nonexistent/units does not exist" in capsys.readouterr().err
    assert not (tmp_path / "edge-agent.service").exists()
