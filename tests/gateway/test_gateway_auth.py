"""Device tokens (stored hashed), revocation, rate limits, and the device CLI; every
registry test on SQLite and on a real PostgreSQL (``state_url``)."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from cloud_gateway.access import Access
from cloud_gateway.auth import DeviceRegistry, RateLimiter, TokenBucket, parse_bearer
from cloud_gateway.config import RateLimitSettings
from cloud_gateway.state import open_state
from edge_core.errors import PermissionDenied, RateLimited, Unauthenticated


def registry_at(url: str, **kwargs) -> DeviceRegistry:  # type: ignore[no-untyped-def]
    return DeviceRegistry(open_state(url), **kwargs)


def test_tokens_are_stored_hashed(state_url: str) -> None:
    registry = registry_at(state_url)
    token = registry.add("cam-01", "rpi5-int8")
    with registry.database.begin() as connection:
        rows = [tuple(r) for r in connection.execute(sa.text("SELECT * FROM devices"))]
    text = repr(rows)
    assert token not in text and token.split(".", 1)[1] not in text
    assert "rpi5-int8" in text
    assert registry.authenticate(token).id == "cam-01"


def test_a_private_write_follows_no_planted_link(tmp_path: Path) -> None:
    """The temporary file of an atomic write has an unguessable name and is created
    exclusively: links planted where an old, predictable name would be are not followed."""
    import os

    from cloud_gateway.auth import write_private

    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    for guess in (f".bundle.json.{os.getpid()}.tmp", ".bundle.json.tmp"):
        (tmp_path / guess).symlink_to(victim)
    write_private(tmp_path / "bundle.json", b"secret\n")
    assert victim.read_text() == "keep me\n"
    assert (tmp_path / "bundle.json").read_bytes() == b"secret\n"
    assert stat.S_IMODE((tmp_path / "bundle.json").stat().st_mode) == 0o600
    assert not any(p.name.endswith(".tmp") and not p.is_symlink() for p in tmp_path.iterdir())


def test_wrong_missing_and_revoked_tokens_are_refused(state_url: str) -> None:
    registry = registry_at(state_url)
    token = registry.add("cam-01", "g")
    other = registry.add("cam-02", "g")
    with pytest.raises(Unauthenticated, match="missing bearer token"):
        registry.authenticate(None)
    with pytest.raises(Unauthenticated, match="invalid token"):
        registry.authenticate(token[:-2] + "xx")
    with pytest.raises(Unauthenticated, match="invalid token"):
        registry.authenticate("cam-01." + other.split(".", 1)[1])  # another device's secret
    with pytest.raises(Unauthenticated, match="invalid token"):
        registry.authenticate("no-dot-at-all")
    registry.revoke("cam-01")
    with pytest.raises(Unauthenticated, match="device 'cam-01' is revoked"):
        registry.authenticate(token)
    assert registry.authenticate(other).id == "cam-02"


def test_a_running_registry_sees_changes_made_by_another(state_url: str) -> None:
    now = [0.0]
    served = registry_at(state_url, clock=lambda: now[0])
    token = registry_at(state_url).add("cam-01", "g")
    now[0] += 1.5
    assert served.authenticate(token).id == "cam-01"
    registry_at(state_url).revoke("cam-01")
    now[0] += 1.5
    with pytest.raises(Unauthenticated, match="revoked"):
        served.authenticate(token)


def test_device_ids_and_duplicates_are_checked(state_url: str) -> None:
    registry = registry_at(state_url)
    registry.add("cam-01", "g")
    with pytest.raises(ValueError, match="already exists"):
        registry.add("cam-01", "g")
    with pytest.raises(ValueError, match="must be 1-64 letters"):
        registry.add("cam/01", "g")
    new = registry.add("cam-01", "g", replace=True)
    assert registry.authenticate(new).id == "cam-01"


def test_bearer_parsing() -> None:
    assert parse_bearer("Bearer abc.def") == "abc.def"
    assert parse_bearer("bearer  abc ") == "abc"
    assert parse_bearer("Basic abc") is None
    assert parse_bearer("Bearer ") is None
    assert parse_bearer(None) is None


def test_token_bucket_refills_at_its_rate() -> None:
    bucket = TokenBucket(rate=10.0, burst=2.0, tokens=2.0, updated=0.0)
    assert bucket.take(0.0) and bucket.take(0.0)
    assert not bucket.take(0.0)
    assert not bucket.take(0.05)
    assert bucket.take(0.1)


def test_rate_limiter_is_per_device() -> None:
    now = [0.0]
    limiter = RateLimiter(rate=1.0, burst=1, clock=lambda: now[0])
    limiter.check("a")
    limiter.check("b")
    with pytest.raises(RateLimited, match="rate limit of 1 requests/s exceeded for device 'a'"):
        limiter.check("a")
    now[0] = 1.0
    limiter.check("a")


def test_access_limits_on_its_clock_and_stamps_last_heard_on_the_wall_clock(
    tmp_path: Path,
) -> None:
    """Both clocks are injected: the rate limit runs on the monotonic one, "last heard"
    (a moment the database keeps) on the wall clock; roles are checked before either."""
    registry = registry_at(f"sqlite:///{tmp_path / 'gateway.sqlite'}")
    token = registry.add("cam-01", "g")
    scraper = registry.add("scraper", "ops", role="metrics")
    now = [0.0]
    access = Access(registry, RateLimitSettings(1.0, 1), clock=lambda: now[0], wall=lambda: 1.7e9)
    assert access.authenticate(token).id == "cam-01"
    with pytest.raises(RateLimited, match="exceeded for device 'cam-01'"):
        access.authenticate(token)
    now[0] = 1.0
    access.authenticate(token)
    assert access.take_heard() == {"cam-01": (1.7e9, "request")}
    access.note_heard("cam-01", "update check")
    assert access.take_heard() == {"cam-01": (1.7e9, "update check")}
    assert access.take_heard() == {}
    with pytest.raises(PermissionDenied, match="may not manage the repository"):
        access.authenticate(token, admin=True)
    with pytest.raises(PermissionDenied, match="it may read /metrics only"):
        access.authenticate(scraper)
    assert access.authenticate(scraper, scrape=True).role == "metrics"
    assert access.take_heard() == {"scraper": (1.7e9, "request")}


def gateway_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cloud_gateway", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.slow
def test_device_cli_prints_the_token_once(tmp_path: Path) -> None:
    result = gateway_cli(
        "--state-dir", str(tmp_path), "device", "add", "cam-07", "--group", "rpi5-int8"
    )
    assert result.returncode == 0, result.stderr
    token = result.stdout.strip()
    assert token.startswith("cam-07.") and len(token) > 40
    assert "shown only this once" in result.stderr
    registry = registry_at(f"sqlite:///{tmp_path / 'gateway.sqlite'}")
    assert registry.authenticate(token).group == "rpi5-int8"
    listing = gateway_cli("--state-dir", str(tmp_path), "device", "list").stdout
    assert "cam-07" in listing and token not in listing
    assert gateway_cli("--state-dir", str(tmp_path), "device", "revoke", "cam-07").returncode == 0
    with pytest.raises(Unauthenticated, match="revoked"):
        registry_at(f"sqlite:///{tmp_path / 'gateway.sqlite'}").authenticate(token)
    failed = gateway_cli("--state-dir", str(tmp_path), "device", "revoke", "nope")
    assert failed.returncode == 1
    assert "no device 'nope'" in failed.stderr and "Traceback" not in failed.stderr
