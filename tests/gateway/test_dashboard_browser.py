"""The dashboard in a real browser: headless Chromium (Debian's package, driven by its
chromedriver through Selenium) against a real gateway, real agents and a real broker.

One world for the module (the gateway, the broker, two agents: cam-01 at 50 °C and
cam-hot at 83 °C, past the Raspberry Pi 5's 80 °C throttle point), one browser. Each
test saves a screenshot: into its own folder, or with ``DASHBOARD_SCREENSHOTS=DIR``
(``make screenshots``) into the docs' images as ``dashboard-<name>.png``.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cloud_gateway.ota.rollouts import in_slice
from tests.support.dashboard_world import (
    SCREENSHOTS,
    DashboardWorld,
    chromium,
    make_world,
)
from tests.support.ota_world import LIGHT_FP32, LIGHT_INT8
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.browser]

XSS = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardWorld]:
    w = make_world(tmp_path_factory.mktemp("dashboard"))
    try:
        for device in ("cam-01", "cam-hot", "cam-xss"):
            w.enroll(device)
        yield w
    finally:
        w.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    driver = chromium(tmp_path_factory.mktemp("chromium"))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def shot(browser: Any, tmp_path: Path) -> Any:
    def save(name: str) -> Path:
        folder = Path(SCREENSHOTS) if SCREENSHOTS else tmp_path
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"dashboard-{name}.png"
        # the whole page, as tall as it is (at most 2,400 px), through the DevTools protocol
        height = browser.execute_script("return document.documentElement.scrollHeight")
        picture = browser.execute_cdp_cmd(
            "Page.captureScreenshot",
            {"format": "png", "captureBeyondViewport": True,
             "clip": {"x": 0, "y": 0, "width": 1280, "height": min(int(height), 2400), "scale": 1}},
        )  # fmt: skip
        path.write_bytes(base64.b64decode(picture["data"]))
        assert path.stat().st_size > 1000
        return path

    return save


def by_id(browser: Any, element_id: str) -> Any:
    from selenium.webdriver.common.by import By

    return browser.find_element(By.ID, element_id)


def css(browser: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(browser.find_elements(By.CSS_SELECTOR, selector))


def navigate(browser: Any, selector: str) -> None:
    """Click what ``selector`` finds (found again if the live refresh replaced it), which
    leads to another page, and wait until that page has replaced this one.

    The old page is marked in its window, and the next page is the one without the
    mark: asking the old page's elements whether they are stale races the navigation
    (Chromium then answers "Node with given id does not belong to the document", not a
    stale reference)."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    browser.execute_script("window.leavingThisPage = true")
    for attempt in range(20):
        try:
            browser.find_element(By.CSS_SELECTOR, selector).click()
            break
        except WebDriverException:  # replaced by the live refresh meanwhile: found again
            if attempt == 19:
                raise
            time.sleep(0.05)

    def arrived(driver: Any) -> bool:
        try:
            return bool(driver.execute_script(
                "return window.leavingThisPage !== true && document.readyState === 'complete'"
            ))  # fmt: skip
        except WebDriverException:  # between two pages
            return False

    WebDriverWait(browser, 20).until(arrived)


def read(browser: Any, selector: str, attribute: str | None = None) -> str | None:
    """The text (or ``attribute``) of the first element ``selector`` finds, ``None`` when
    none does: read again when the live refresh replaced it meanwhile."""
    from selenium.common.exceptions import WebDriverException

    for _ in range(20):
        try:
            found = css(browser, selector)
            if not found:
                return None
            value = found[0].text if attribute is None else found[0].get_attribute(attribute)
            return str(value) if value is not None else None
        except WebDriverException:  # stale, or "does not belong to the document": swapped
            time.sleep(0.05)
    raise AssertionError(f"{selector} kept changing")


def sign_in(browser: Any, world: DashboardWorld, token: str | None = None) -> None:
    browser.get(f"{world.url}/ui/login")
    if "/ui/login" not in browser.current_url:
        return  # signed in already
    by_id(browser, "token").send_keys(token or world.admin_token)
    navigate(browser, "#sign-in")


def no_alert(browser: Any) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert  # noqa: B018 - an alert here is a script that ran


def health_of(browser: Any, device: str) -> str | None:
    return read(browser, f"#device-{device}", "data-health")


def test_a_device_token_cannot_sign_in_an_admin_can_and_signs_out(
    world: DashboardWorld, browser: Any, shot: Any
) -> None:
    browser.get(f"{world.url}/ui/fleet")
    assert "/ui/login" in browser.current_url  # no session: the sign-in page
    sign_in(browser, world, world.tokens["cam-01"])
    message = by_id(browser, "message").text
    assert "cam-01 is a device" in message and "cannot sign in" in message
    assert not browser.get_cookie("edge_session")
    shot("sign-in-refused")
    sign_in(browser, world)
    assert browser.current_url.endswith("/ui/fleet")
    assert by_id(browser, "actor").text == "ops"
    cookie = browser.get_cookie("edge_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert not cookie["secure"]  # plain HTTP here; Secure when the gateway serves TLS
    navigate(browser, "#sign-out")
    assert "/ui/login" in browser.current_url
    # the old cookie is dead on the gateway, not just forgotten by the browser
    old = httpx.get(f"{world.url}/api/fleet", cookies={"edge_session": cookie["value"]})
    assert old.status_code == 401
    sign_in(browser, world)
    assert browser.current_url.endswith("/ui/fleet")


def test_a_started_agent_appears_on_fleet_without_a_reload(
    world: DashboardWorld, browser: Any, shot: Any
) -> None:
    sign_in(browser, world)
    browser.get(f"{world.url}/ui/fleet")
    assert health_of(browser, "cam-01") == "offline"  # enrolled, never heard from
    browser.execute_script("window.notReloaded = true")
    started = time.monotonic()
    world.start_agents()
    wait_for(lambda: health_of(browser, "cam-01") == "healthy", 60, "cam-01 healthy on Fleet")
    appeared = time.monotonic() - started
    assert browser.execute_script("return window.notReloaded === true"), "the page reloaded"
    # healthy from its first update check; its profile comes with its status message
    wait_for(
        lambda: read(browser, "#device-cam-01 .profile") == "raspberry-pi-5", 30, "its profile"
    )
    assert "digits-light v1" in (read(browser, "#device-cam-01 .models") or "")
    wait_for(lambda: health_of(browser, "cam-hot") == "hot", 30, "cam-hot hot on Fleet")
    assert int((read(browser, "#count-total") or "").split()[0]) == 3
    print(f"cam-01 appeared healthy {appeared:.1f} s after its agent was started")
    shot("fleet")


def test_a_hot_device_shows_as_hot_with_the_rule_on_hover(
    world: DashboardWorld, browser: Any, shot: Any
) -> None:
    sign_in(browser, world)
    world.start_agents()
    browser.get(f"{world.url}/ui/fleet?health=hot")
    wait_for(lambda: health_of(browser, "cam-hot") == "hot", 60, "cam-hot hot")
    assert health_of(browser, "cam-01") is None  # the filter keeps only the hot ones
    rule = read(browser, "#device-cam-hot .health", "title") or ""
    assert rule.startswith("hot: its last status says throttled") and "83.0 °C" in rule
    assert (read(browser, "#count-hot") or "").startswith("1")
    seed_history(world, "cam-hot", minutes=90)
    browser.get(f"{world.url}/ui/devices/cam-hot")
    # the seeded status is the latest for a moment, until the agent's next (every second)
    wait_for(lambda: read(browser, "#device-health") == "hot", 20, "cam-hot hot again")
    assert read(browser, "#device-profile") == "raspberry-pi-5"
    assert "waiting" in (read(browser, "#device-queue") or "")
    # its history: a point a minute, the seeded hour and a half and what the agent sent
    points = wait_for(lambda: longest_line(browser), 20, "a chart with a line")
    assert points >= 90
    shot("device")


def longest_line(browser: Any) -> int:
    """The most points a chart's line has (0: no chart yet), read in the page at once:
    the live refresh may swap the charts between two reads from here."""
    return int(browser.execute_script(
        "return Math.max(0, ...Array.from(document.querySelectorAll('svg polyline.line'))"
        ".map(l => (l.getAttribute('points') || '').trim().split(/\\s+/).filter(Boolean).length))"
    ))  # fmt: skip


def seed_history(world: DashboardWorld, device: str, minutes: int) -> None:
    """``minutes`` of past telemetry of ``device``, one sample a minute, written through
    the gateway's store as its ingest writes them (an agent sends one a minute's worth
    only as time passes): what its page shows after an hour and a half. The last one is
    its latest status until the agent's next telemetry replaces it."""
    import math

    from cloud_gateway.fleet.store import Sample
    from cloud_gateway.fleet.telemetry import columns

    now = time.time()
    samples = []
    local = offloaded = 0  # counts since the agent started, as it reports them
    for index in range(minutes, 0, -1):
        at = now - index * 60
        wave = math.sin(index / 9)
        local += 40 + int(10 * wave)
        offloaded += 12 + int(8 * wave)
        documents = {
            "status": {"temperatures": {"cpu": 74 + 6 * wave}, "cpu_load": 0.9 + 0.5 * wave,
                       "queue": {"waiting": max(0, int(20 * wave)), "dropped": 0}},
            "decisions": {"decisions": [
                {"action": "LOCAL", "count": local},
                {"action": "OFFLOAD", "count": offloaded},
            ], "degraded": 0},
            "latency": {"by_answerer": {"device": {"p50_ms": 3.1 + wave},
                                        "cloud": {"p50_ms": 18 + 4 * wave}}},
        }  # fmt: skip
        for kind, document in documents.items():
            values = columns(kind, document)
            samples.append(Sample(device, kind, now, int(at // 60), "mqtt", None, values))
    fleet = world.gateway.gateway.fleet
    for minute in range(0, len(samples), 3):  # a minute's kinds a batch, as a flush has them
        fleet.write(samples[minute : minute + 3])


def _start_from_models_page(
    browser: Any, world: DashboardWorld, version: int, percent: float
) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{world.url}/ui/models")
    row = by_id(browser, f"start-digits-light-{version}")
    field = row.find_element(By.NAME, "percent")
    field.clear()
    field.send_keys(f"{percent:g}")
    navigate(browser, f"#start-digits-light-{version} button.start")
    assert "/ui/confirm" in browser.current_url
    sentence = by_id(browser, "sentence").text
    assert sentence.startswith(f"Start the rollout of digits-light v{version} for rpi5-int8")
    navigate(browser, "#confirm")
    assert browser.current_url.endswith("/ui/rollouts")


def _installed(browser: Any, version: int) -> int:
    value = read(browser, f"#rollout-digits-light-{version}-rpi5-int8", "data-installed")
    return int(value) if value is not None else -1


def _confirm(browser: Any, world: DashboardWorld, version: int, action: str) -> str:
    browser.get(f"{world.url}/ui/rollouts")
    navigate(browser, f"#rollout-digits-light-{version}-rpi5-int8 button.{action}")
    sentence = str(by_id(browser, "sentence").text)
    navigate(browser, "#confirm")
    assert browser.current_url.endswith("/ui/rollouts")
    return sentence


def test_a_rollout_started_from_the_page_reaches_the_agents_and_its_bar_moves(
    world: DashboardWorld, browser: Any, shot: Any
) -> None:
    sign_in(browser, world)
    world.start_agents()
    wait_for(lambda: world.serving("cam-01") == 1 and world.serving("cam-hot") == 1, 60,
               "both agents up")  # fmt: skip
    world.publish("digits-light", 2, LIGHT_INT8)
    _start_from_models_page(browser, world, 2, 100)
    assert (
        read(browser, "#rollout-digits-light-2-rpi5-int8", "data-slice") == "3"
    )  # cam-01, cam-hot and cam-xss (no agent)
    browser.execute_script("window.notReloaded = true")
    wait_for(lambda: _installed(browser, 2) == 2, 60, "two installs on the progress bar")
    assert browser.execute_script("return window.notReloaded === true"), "the page reloaded"
    width = read(browser, "#rollout-digits-light-2-rpi5-int8 rect.seg.installed", "width")
    assert float(width or 0) == pytest.approx(66.67, abs=0.01)
    assert world.serving("cam-01") == 2 and world.serving("cam-hot") == 2  # the agents say so
    audit = read(browser, "#rollouts-live") or ""
    assert "ops start digits-light v2 for rpi5-int8" in audit
    shot("rollouts")

    def running() -> bool:  # who runs which: two devices of the group on v2
        browser.get(f"{world.url}/ui/models")
        return "rpi5-int8 v2 2" in (read(browser, "#model-digits-light") or "")

    wait_for(running, 20, "the Models page: two devices on v2")
    shot("models")


def test_pause_stops_a_rollout_and_resume_lets_it_go_on(
    world: DashboardWorld, browser: Any, shot: Any
) -> None:
    sign_in(browser, world)
    world.start_agents()
    world.publish("digits-light", 3, LIGHT_FP32)
    # the smallest percent whose slice holds one of the two agents and not the other
    first, second = "cam-01", "cam-hot"
    percent = next(p for p in range(1, 101) if in_slice(first, "digits-light", p)
                   or in_slice(second, "digits-light", p))  # fmt: skip
    if in_slice(second, "digits-light", percent):
        first, second = second, first
    assert not in_slice(second, "digits-light", percent)
    wait_for(lambda: world.serving(first) == 2 and world.serving(second) == 2, 60, "on v2")
    _start_from_models_page(browser, world, 3, percent)
    wait_for(lambda: _installed(browser, 3) == 1, 60, f"{first} installed v3")
    assert world.serving(first) == 3
    sentence = _confirm(browser, world, 3, "pause")
    assert "Pause the rollout of digits-light v3 for rpi5-int8 (active" in sentence
    assert read(browser, "#rollout-digits-light-3-rpi5-int8", "data-state") == "paused"
    # raised while paused: the slice grows, announced to the group; nobody new installs
    browser.get(f"{world.url}/ui/rollouts")
    field = by_id(browser, "percent-digits-light-3-rpi5-int8")  # kept by the live refresh
    field.clear()
    field.send_keys("100")
    navigate(browser, "#rollout-digits-light-3-rpi5-int8 button.raise")
    assert "Its state stays paused" in by_id(browser, "sentence").text
    raised = time.time()
    navigate(browser, "#confirm")
    seen = world.gateway.gateway.ota.rollouts.last_seen  # type: ignore[union-attr]
    wait_for(lambda: (seen().get(second, (0.0, ""))[0] or 0.0) > raised, 30,
               f"{second} checked after the raise")  # fmt: skip
    time.sleep(2)
    assert world.serving(second) == 2, "a paused rollout reached a device"
    assert _installed(browser, 3) == 1
    shot("rollout-paused")
    _confirm(browser, world, 3, "resume")
    wait_for(lambda: _installed(browser, 3) == 2, 60, f"{second} installed v3 after resume")
    assert world.serving(second) == 3
    audit = read(browser, "#rollouts-live") or ""
    for done in ("ops pause digits-light v3", "ops raise digits-light v3", "ops resume"):
        assert done in audit


def test_values_from_devices_are_text_never_markup(
    world: DashboardWorld, browser: Any, shot: Any
) -> None:
    # a device whose telemetry (over HTTP, as one without a broker sends it) is hostile
    answer = httpx.post(
        f"{world.url}/v2/telemetry",
        headers={"authorization": f"Bearer {world.tokens['cam-xss']}"},
        json={"status": {"profile": XSS, "models": {XSS: {"version": 1, "variant": XSS}},
                         "temperatures": {XSS: 40.0}, "interval_s": 3600}},
    )  # fmt: skip
    assert answer.status_code == 200, answer.text
    sign_in(browser, world)
    browser.get(f"{world.url}/ui/fleet")
    wait_for(lambda: read(browser, "#device-cam-xss .profile") == XSS, 20, "the XSS profile")
    assert XSS in (read(browser, "#device-cam-xss .models") or "")
    no_alert(browser)
    scripts = browser.execute_script(  # read in the page: the live refresh may swap it
        "return Array.from(document.scripts).map(s => s.innerHTML)"
    )
    assert not [text for text in scripts if "alert" in text]
    shot("xss")
    browser.get(f"{world.url}/ui/devices/cam-xss")
    assert XSS in (read(browser, "#device-live") or "")
    no_alert(browser)
