"""``python -m benchmarks dashboard``: the Fleet page's load time with N simulated devices.

The devices are the fleet simulator's (:mod:`benchmarks.gateway.fleet`: tokens in the
state database, no agent); each sends one telemetry document set (status, decisions,
latency) over HTTP, as a device without a broker does with its update check, through
keep-alive connections: 80% healthy, 10% hot (throttled), 5% degraded (offload breaker
open), 5% never heard from. One real ``cloud-gateway serve`` process serves them, on
SQLite by default or ``--state URL``. Then an admin signs in and the pages are timed,
one request at a time on a kept-alive connection (what the gateway spends: the whole
fleet's health and counts for every page, whatever the page size):

- ``GET /ui/fleet``: the whole page, its first 50 devices;
- the same with ``HX-Request`` (what the live refresh asks for every ``refresh_s``);
- ``GET /ui/fleet?health=hot`` (a filter), ``GET /api/fleet?size=200`` (the API's
  largest page);

and, with ``--browser`` (Selenium and Debian's ``chromium`` + ``chromium-driver``, the
dev extra), the page in headless Chromium: navigation start to the load event, from the
browser's own Navigation Timing.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import re
import shutil
import statistics
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

from benchmarks.gateway.fleet import MODEL, Pool, enroll, start_replicas
from cloud_gateway.auth import DeviceRegistry
from cloud_gateway.state import describe, open_state
from edge_core.processes import stop_process
from edge_core.report import machine_info, publish, render_table

__all__ = ["device_documents", "expected_counts", "register", "run_dashboard"]

PAGES: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("fleet page", "/ui/fleet", {}),
    ("live refresh (htmx)", "/ui/fleet", {"HX-Request": "true"}),
    ("filtered: hot", "/ui/fleet?health=hot", {}),
    ("API, 200 a page", "/api/fleet?size=200", {}),
)


def register(commands: Any) -> None:
    bench = commands.add_parser("dashboard", help="the Fleet page's load time with N devices")
    bench.add_argument("--devices", type=int, default=1000)
    bench.add_argument("--state", dest="dashboard_state", help="state URL (default: SQLite)")
    bench.add_argument("--requests", type=int, default=50, help="timed requests a page")
    bench.add_argument("--browser", action="store_true", help="also time it in headless Chromium")
    bench.add_argument("--json", type=Path, help="write the results here")
    bench.set_defaults(run=run_dashboard)


def device_documents(index: int, now: float) -> dict[str, Any] | None:
    """Simulated device ``index``'s telemetry, as an agent sends it (``None``: a device
    never heard from)."""
    share = index % 20
    if share == 19:
        return None
    status: dict[str, Any] = {
        "time": now, "profile": "raspberry-pi-5", "power_mode": "balanced",
        "models": {MODEL: {"version": 1 + index % 2, "variant": "tflite-int8"}},
        "temperatures": {"cpu": 55.0 + index % 10}, "throttled": False, "critical": False,
        "cpu_load": 0.4, "queue": {"waiting": 0, "dropped": 0}, "interval_s": 3600,
        "offload": {"breaker": "closed", "guard_refusals": {}},
    }  # fmt: skip
    if share in (17, 18):
        status.update(throttled=True, temperatures={"cpu": 82.5})
    if share == 16:
        status["offload"] = {"breaker": "open", "guard_refusals": {}}
    return {
        "status": status,
        "decisions": {"time": now, "degraded": 0, "decisions": [
            {"action": "LOCAL", "reason": "fits", "count": 40 + index % 7},
            {"action": "OFFLOAD", "reason": "heavy", "count": 3},
        ]},
        "latency": {"time": now, "by_answerer": {"device": {"p50_ms": 4.2, "p95_ms": 6.0,
                                                            "p99_ms": 9.1}}},
    }  # fmt: skip


async def _send_telemetry(port: int, devices: list[tuple[str, str]]) -> dict[str, Any]:
    pool = Pool([port], 16)
    await pool.open()
    now = time.time()
    started = time.perf_counter()
    try:
        sends = []
        for index, (_, token) in enumerate(devices):
            documents = device_documents(index, now)
            if documents is not None:
                body = json.dumps(documents).encode()
                sends.append(pool.request("POST", "/v2/telemetry", token, body))
        await asyncio.gather(*sends)
    finally:
        pool.close()
    seconds = time.perf_counter() - started
    _, errors = pool.take()
    if errors:
        raise RuntimeError(f"telemetry refused: {errors[:3]}")
    return {"documents": len(sends), "seconds": round(seconds, 2)}


class _Session:
    """An admin signed in on a kept-alive connection."""

    def __init__(self, port: int, token: str) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        page = self._get("/ui/login", {})
        login = dict(c.split(";")[0].split("=", 1) for c in page.headers.get_all("set-cookie"))
        found = re.search(r'name="login_csrf" value="([^"]+)"', page.body)
        if found is None:
            raise RuntimeError("no sign-in form")
        form = urllib.parse.urlencode({"login_csrf": found.group(1), "token": token})
        self.connection.request("POST", "/ui/login", form, {
            "Content-Type": "application/x-www-form-urlencoded",
            "Cookie": f"edge_login={login['edge_login']}",
        })  # fmt: skip
        answer = self.connection.getresponse()
        answer.read()
        cookies = [c.split(";")[0] for c in answer.headers.get_all("set-cookie") or []]
        session = [c for c in cookies if c.startswith("edge_session=")]
        if answer.status != 303 or not session:
            raise RuntimeError(f"sign-in refused: {answer.status}")
        self.cookie = session[0]

    class _Page:
        def __init__(self, status: int, headers: Any, body: str) -> None:
            self.status, self.headers, self.body = status, headers, body

    def _get(self, path: str, headers: dict[str, str]) -> _Session._Page:
        self.connection.request("GET", path, headers=headers)
        answer = self.connection.getresponse()
        return self._Page(answer.status, answer.headers, answer.read().decode())

    def get(self, path: str, headers: dict[str, str]) -> tuple[float, int, str]:
        started = time.perf_counter()
        page = self._get(path, {**headers, "Cookie": self.cookie})
        seconds = time.perf_counter() - started
        if page.status != 200:
            raise RuntimeError(f"GET {path}: {page.status} {page.body[:200]}")
        return seconds, len(page.body.encode()), page.body


def expected_counts(devices: int) -> dict[str, int]:
    """The health of each simulated device once its telemetry is in (see
    :func:`device_documents`)."""
    counts = {"healthy": 0, "hot": 0, "degraded": 0, "offline": 0}
    for index in range(devices):
        share = index % 20
        state = {19: "offline", 18: "hot", 17: "hot", 16: "degraded"}.get(share, "healthy")
        counts[state] += 1
    return {"total": devices, **counts}


def _wait_for_counts(session: _Session, expected: dict[str, int]) -> dict[str, Any]:
    """The counts once every document is written (a request marks its device heard at
    once; its telemetry is written within the ingest's second)."""
    end = time.monotonic() + 60
    while True:
        _, _, body = session.get("/api/fleet?size=1", {})
        counts: dict[str, Any] = json.loads(body)["counts"]
        if counts == expected:
            return counts
        if time.monotonic() > end:
            raise RuntimeError(f"the fleet's counts are {counts}, not {expected}")
        time.sleep(0.5)


def _browser(url: str, token: str, loads: int) -> dict[str, Any]:
    """The Fleet page in headless Chromium: navigation start to the load event."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1280,900"):  # fmt: skip
        options.add_argument(argument)
    driver = webdriver.Chrome(
        service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=options
    )
    try:
        driver.get(f"{url}/ui/login")
        driver.find_element(By.ID, "token").send_keys(token)
        driver.find_element(By.ID, "sign-in").click()
        times = []
        for _ in range(loads):
            driver.get(f"{url}/ui/fleet")
            timing = driver.execute_script(
                "const n = performance.getEntriesByType('navigation')[0];"
                "return [n.responseStart - n.requestStart, n.domContentLoadedEventEnd,"
                " n.loadEventEnd];"
            )
            times.append([float(t) for t in timing])
        rows = len(driver.find_elements(By.CSS_SELECTOR, "table.fleet tbody tr"))
    finally:
        driver.quit()
    first_byte, dom, load = (statistics.median(column) for column in zip(*times, strict=True))
    return {"loads": loads, "rows_shown": rows, "first_byte_ms": round(first_byte, 1),
            "dom_content_loaded_ms": round(dom, 1), "load_ms": round(load, 1)}  # fmt: skip


def _measure(args: argparse.Namespace, root: Path, url: str, report: dict[str, Any]) -> None:
    database = open_state(url)
    devices = enroll(database, args.devices)
    admin = DeviceRegistry(database).add("bench-admin", "operators", role="admin")
    database.close()
    [(process, port)] = start_replicas(root, url, 1)
    try:
        report["telemetry"] = asyncio.run(_send_telemetry(port, devices))
        session = _Session(port, admin)
        report["counts"] = _wait_for_counts(session, expected_counts(args.devices))
        pages = []
        for name, path, headers in PAGES:
            session.get(path, headers)  # warm
            timed = [session.get(path, headers) for _ in range(args.requests)]
            ms = sorted(t * 1000 for t, _, _ in timed)
            pages.append({"page": name, "path": path, "requests": len(ms),
                          "p50_ms": round(ms[len(ms) // 2], 1),
                          "p95_ms": round(ms[int(len(ms) * 0.95) - 1], 1),
                          "bytes": timed[-1][1]})  # fmt: skip
        report["pages"] = pages
        if args.browser:
            report["browser"] = _browser(f"http://127.0.0.1:{port}", admin, 10)
    finally:
        stop_process(process)


def format_dashboard(report: dict[str, Any]) -> str:
    counts = report["counts"]
    lines = [
        f"{report['devices']} simulated devices ({report['state']}): "
        + ", ".join(f"{counts[k]} {k}" for k in ("healthy", "hot", "degraded", "offline")),
        render_table(
            ["page", "path", "p50 ms", "p95 ms", "bytes"],
            [[p["page"], p["path"], p["p50_ms"], p["p95_ms"], p["bytes"]] for p in report["pages"]],
        ),
    ]
    browser = report.get("browser")
    if browser:
        lines.append(
            f"headless Chromium, median of {browser['loads']} loads of /ui/fleet: first byte "
            f"{browser['first_byte_ms']} ms, DOMContentLoaded {browser['dom_content_loaded_ms']}"
            f" ms, load {browser['load_ms']} ms ({browser['rows_shown']} rows shown)"
        )
    return "\n".join(lines)


def run_dashboard(args: argparse.Namespace) -> int:
    report: dict[str, Any] = {
        "benchmark": "dashboard",
        "machine": machine_info(),
        "devices": args.devices,
        "state": describe(args.dashboard_state) if args.dashboard_state else "sqlite (embedded)",
        "command": f"python -m benchmarks dashboard --devices {args.devices}"
        + (" --browser" if args.browser else "")
        + (" --state URL" if args.dashboard_state else ""),
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        url = args.dashboard_state or f"sqlite:///{root / 'fleet.sqlite'}"
        _measure(args, root, url, report)
    publish(format_dashboard(report), report, args.json)
    return 0
