"""The benchmarks' figures page: every ``bench-results/*.json`` rendered into
``docs/benchmarks/figures.md``, so that no figure in the docs is typed by hand.

``make bench`` runs each benchmark (it writes its JSON), stamps that JSON with
the date and the commit it ran at, then renders the page::

    python -m benchmarks stamp bench-results/offload.json
    python -m benchmarks figures --results bench-results --out docs/benchmarks/figures.md

Each benchmark's section shows the table its own command prints (the
benchmark's formatter, so the page and the terminal never disagree), the
machine it ran on, the date and the commit, and the targets of MISSION §7
(P1-P12) that its figures judge. A JSON today's formatter cannot read (an older
run) is named with the error instead of its table. The page opens by saying it
is generated and must not be edited. A benchmark not in this run keeps its
section of the page as it was (with the date and commit it names).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

from benchmarks.targets import TARGETS, Report, judge, verdict

__all__ = ["Benchmark", "kind_of", "register", "render_page", "stamp"]

ROOT = Path(__file__).resolve().parents[1]
# What the figures depend on: a run at another commit is older than the code when one of
# these changed (this page's own renderer and its targets are not among them).
CODE = (
    "edge_core",
    "edge_agent",
    "cloud_gateway",
    "benchmarks/agent",
    "benchmarks/gateway",
    "benchmarks/peers",
    "device_profiles",
    "models",
    "tools/eval_faces.py",
)


@dataclass(frozen=True)
class Benchmark:
    """One kind of benchmark: how it is run, and how its JSON is shown."""

    title: str
    command: str  # as `make bench` runs it (the JSON's own file name is added)
    formatter: str  # "module:function" printing its table, or "" (rendered here)


BENCHMARKS: dict[str, Benchmark] = {
    "runtime": Benchmark(
        "Runtime", "edge-agent bench --model {model}", "edge_agent.latency:format_report"
    ),
    "hybrid": Benchmark(
        "Hybrid inference", "python -m benchmarks hybrid", "benchmarks.agent.hybrid:format_hybrid"
    ),
    "offload": Benchmark(
        "Offload round trip",
        "python -m benchmarks offload --profile {profile}",
        "benchmarks.agent.offload:format_offload",
    ),
    "offload-link": Benchmark(
        "Offload sized for the link",
        "python -m benchmarks offload --link {rates}",
        "benchmarks.agent.link:format_link",
    ),
    "ota": Benchmark("OTA install", "python -m benchmarks ota", "benchmarks.agent.ota:format_ota"),
    "mqtt": Benchmark("MQTT", "python -m benchmarks mqtt", "benchmarks.agent.mqtt:format_mqtt"),
    "service": Benchmark(
        "The agent as a service",
        "python -m benchmarks service",
        "benchmarks.agent.service_report:format_service",
    ),
    "gateway": Benchmark(
        "Gateway under load",
        "python -m benchmarks gateway --chart bench-results/gateway.png",
        "benchmarks.gateway.limits:format_report",
    ),
    "stream": Benchmark(
        "Streams: the pipeline against a sequential loop",
        "python -m benchmarks stream",
        "benchmarks.agent.stream:format_stream",
    ),
    "faces": Benchmark(
        "Face detectors and redaction",
        "python -m benchmarks privacy",
        "benchmarks.agent.faces:format_privacy",
    ),
    "build": Benchmark("Model build", "{command}", "edge_agent.toolchain.report:format_build"),
    "remote": Benchmark(
        "Gateway in front of a remote engine",
        "{command}",
        "benchmarks.gateway.remote:format_remote",
    ),
    "fleet": Benchmark(
        "Fleet simulation",
        "{command}",
        "benchmarks.gateway.fleet:format_fleet",
    ),
    "peers": Benchmark(
        "The gateway beside Triton and MLServer",
        "{command}",
        "benchmarks.peers.compare:format_peers",
    ),
}


def kind_of(report: Report) -> str:
    """The benchmark a JSON came from: its ``benchmark`` field (older face evals wrote
    none: their shape tells)."""
    kind = report.get("benchmark")
    if isinstance(kind, str):
        return kind
    if "scenes" in report and "results" in report:
        return "faces"
    return "unknown"


# -- stamping a run ------------------------------------------------------------------------


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip()


def stamp(path: Path, *, now: datetime | None = None) -> None:
    """Record in a benchmark's JSON when it ran and at which commit (run right after
    the benchmark; the machine too when the benchmark wrote none)."""
    from edge_core.report import machine_info, write_json

    report = json.loads(path.read_text(encoding="utf-8"))
    status = _git("status", "--porcelain", "--untracked-files=no", "--", *CODE)
    recorded: dict[str, Any] = {
        "date": (now or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
        "commit": _git("rev-parse", "HEAD"),
        # to the code (docs and results do not change a figure)
        "uncommitted_changes": bool(status) if status is not None else None,
        # what else ran: figures from a busy machine are slower than the code
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    if "machine" not in report:
        recorded["machine"] = machine_info()
    report["recorded"] = recorded
    write_json(path, report)


def changed_since(commit: str) -> bool | None:
    """Whether the code differs today from ``commit`` (None: cannot tell)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "diff", "--quiet", commit, "--", *CODE], capture_output=True
        )
    except OSError:
        return None
    return {0: False, 1: True}.get(done.returncode)


# -- rendering -----------------------------------------------------------------------------

HEADER = """\
# Benchmark figures

!!! warning "Generated by `make bench`: do not edit"
    This page is written by `benchmarks/page.py` from the JSON that the benchmarks
    leave in `bench-results/`. To change a figure, run the benchmarks again
    (`make bench`, or one of them: `make bench-offload figures`); to change how
    the page looks, change the tool. What each benchmark measures, and how:
    [Benchmarks](index.md).

Figures are of the machine named in each section, at the commit named there: they
judge that machine and that code, nothing else.
"""


def _anchor(name: str) -> str:
    return "bench-" + "".join(c if c.isalnum() else "-" for c in name.lower())


def _title(kind: str, report: Report) -> str:
    benchmark = BENCHMARKS.get(kind)
    title = benchmark.title if benchmark else f"Benchmark {kind!r}"
    named = kind in ("runtime", "build") and "model" in report
    return f"{title}: {report['model']}" if named else title


def _machine(report: Report) -> str:
    machine = report.get("machine") or report.get("recorded", {}).get("machine")
    if not isinstance(machine, Mapping):
        return "not recorded"
    text = f"{machine.get('machine', '?')}, {machine.get('cpus', '?')} CPUs"
    if machine.get("platform"):
        text += f", {machine['platform']}"
    if machine.get("python"):
        text += f", Python {machine['python']}"
    if report.get("profile"):
        text += f"; profile `{report['profile']}`"
    return text


def _when(report: Report, changed: Callable[[str], bool | None]) -> str:
    recorded = report.get("recorded")
    if not isinstance(recorded, Mapping) or not recorded.get("commit"):
        return "date and commit not recorded (a run outside `make bench`)"
    commit = str(recorded["commit"])
    text = f"{recorded.get('date', 'an unknown date')} at commit `{commit[:10]}`"
    if recorded.get("uncommitted_changes"):
        text += " (with uncommitted changes to the code)"
    load = recorded.get("load_average_1m")
    if load is not None:
        text += f"; load average {load} (1 min) as it ended"
        machine = report.get("machine") or recorded.get("machine") or {}
        cpus = machine.get("cpus") if isinstance(machine, Mapping) else None
        if isinstance(cpus, int) and cpus > 0 and float(load) >= cpus:
            text += " (**a busy machine**: slower figures than an idle one gives)"
    if changed(commit):
        text += "; **the code has changed since**: these figures may be out of date"
    return text


def _command(kind: str, report: Report, name: str) -> str:
    benchmark = BENCHMARKS.get(kind)
    if benchmark is None:
        return f"`bench-results/{name}.json`"
    command = benchmark.command.format(
        model=report.get("model", "?"),
        profile=report.get("profile", "?"),
        command=report.get("command", "?"),  # what the run was given (its engine, its fleet)
        rates=",".join(f"{r:g}" for r in report.get("settings", {}).get("rates_mbit", [])),
    )
    return f"`{command} --json bench-results/{name}.json` (`make bench-{name}`)"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(value: Any) -> str:
        return "–" if value is None else str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _body(kind: str, report: Report) -> str:
    """The benchmark's own table (what its command prints), or why there is none."""
    benchmark = BENCHMARKS.get(kind)
    if benchmark is None:
        return f"No renderer for a benchmark named {kind!r}: add one to `benchmarks/page.py`."
    module, _, function = benchmark.formatter.partition(":")
    formatter = cast(Callable[[Report], str], getattr(importlib.import_module(module), function))
    try:
        text = formatter(report)
    except (KeyError, TypeError, ValueError, IndexError, StopIteration) as exc:
        return _unreadable(exc)
    return "```text\n" + text + "\n```"


def _unreadable(exc: BaseException) -> str:
    return (
        '!!! failure "Today\'s formatter cannot read this JSON"\n'
        f"    `{type(exc).__name__}: {exc}`: it comes from an older run. Run the benchmark "
        "again."
    )


def _section(name: str, report: Report, changed: Callable[[str], bool | None]) -> str:
    kind = kind_of(report)
    lines = [
        f"## {_title(kind, report)} {{#{_anchor(name)}}}",
        "",
        f"- **Command**: {_command(kind, report, name)}",
        f"- **Machine**: {_machine(report)}",
        f"- **Ran**: {_when(report, changed)}",
        "",
    ]
    judged = [t for t in TARGETS if t.kind == kind and t.judge is not None]
    if judged:
        rows = []
        for target in judged:
            measured, met = judge(target, report)
            rows.append([f"{target.id}: {target.what}", target.target, measured, verdict(met)])
        lines += [_table(["target", "wanted", "measured", "verdict"], rows), ""]
    lines += [_body(kind, report), ""]
    if report.get("chart"):
        lines += [f"![{_title(kind, report)}]({report['chart']})", ""]
    return "\n".join(lines)


def _summary(reports: Mapping[str, Report], kept: Mapping[str, list[Any]]) -> str:
    rows = []
    for target in TARGETS:
        judged = [(n, r) for n, r in reports.items() if kind_of(r) == target.kind]
        if target.judge is None:
            rows.append([target.id, target.what, target.target, "no benchmark yet", "–"])
            continue
        if not judged:
            rows.append(
                kept.get(target.id)
                or [target.id, target.what, target.target, "not in this run", "–"]
            )
            continue
        verdicts = [(judge(target, r), n) for n, r in judged]
        shown = [(v, n) for v, n in verdicts if v[1] is not None] or verdicts
        measured = "<br>".join(f"[{v[0]}](#{_anchor(n)})" for v, n in shown)
        met = [v[1] for v, _ in shown if v[1] is not None]
        rows.append(
            [target.id, target.what, target.target, measured, verdict(all(met) if met else None)]
        )
    return "## Targets (MISSION §7)\n\n" + _table(
        ["", "what", "target", "measured", "verdict"], rows
    )


_HEADING = re.compile(r"^## (.*) \{#(bench-[a-z0-9-]+)\}$")
_ROW = re.compile(r"^\| (P[0-9]+b?) \|")


def _previous(page: str, exclude: set[str]) -> tuple[dict[str, str], dict[str, list[Any]]]:
    """The sections of a previous page by anchor (but those in ``exclude``), and its
    summary's rows by target that link to them."""
    sections: dict[str, str] = {}
    current: str | None = None
    for line in page.splitlines():
        if line.startswith("## "):
            match = _HEADING.match(line)
            current = match.group(2) if match and match.group(2) not in exclude else None
        if current is not None:
            sections[current] = sections.get(current, "") + line + "\n"
    rows: dict[str, list[Any]] = {}
    for line in page.splitlines():
        match = _ROW.match(line)
        if match and any(f"(#{anchor})" in line for anchor in sections):
            rows[match.group(1)] = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
    return {anchor: text.rstrip("\n") + "\n" for anchor, text in sections.items()}, rows


def _section_order(text: str) -> tuple[int, str]:
    """Where a section goes: its benchmark's place, by its title, then its anchor."""
    match = _HEADING.match(text.splitlines()[0])
    title, anchor = (match.group(1), match.group(2)) if match else ("", "")
    titles = [b.title for b in BENCHMARKS.values()]
    place = next((i for i, t in enumerate(titles) if title.startswith(t)), len(titles))
    return place, anchor


def _order(name: str, report: Report) -> tuple[int, str]:
    kinds = list(BENCHMARKS)
    kind = kind_of(report)
    return (kinds.index(kind) if kind in kinds else len(kinds), name)


def render_page(
    reports: Mapping[str, Report],
    *,
    changed: Callable[[str], bool | None] = changed_since,
    previous: str = "",
) -> str:
    """The page for ``reports`` (by file stem, e.g. ``"offload"``); ``previous``: the
    page as it was, whose sections (and summary rows) of benchmarks not in ``reports``
    are kept as they were, with the date and commit they name: a run of one benchmark
    leaves the others' figures on the page."""
    ordered = dict(sorted(reports.items(), key=lambda item: _order(*item)))
    sections, rows = _previous(previous, exclude={_anchor(name) for name in ordered})
    parts = [HEADER, _summary(ordered, rows)]
    if not ordered and not sections:
        parts.append("No benchmark has been run: `make bench` runs them all.")
    drawn = [_section(name, report, changed) for name, report in ordered.items()]
    drawn += list(sections.values())
    parts += sorted(drawn, key=_section_order)
    shown = set(ordered) | {anchor.removeprefix("bench-") for anchor in sections}
    missing = [name for name in _MAKE_NAMES if name not in shown]
    if missing:
        parts.append(
            "## Not in this run\n\nRun any of these, then `make figures`:\n\n"
            + "\n".join(f"- `make bench-{n}`" for n in missing)
        )
    return "\n\n".join(p.rstrip("\n") for p in parts) + "\n"


# the benchmarks `make bench` runs (its BENCHES), by the name of their JSON file
_MAKE_NAMES = ("digits-light", "digits-heavy", "blazeface", "hybrid", "offload", "link", "ota",
               "mqtt", "service", "gateway", "remote", "fleet-1k", "fleet-10k",
               "faces")  # fmt: skip


def load_reports(results: Path, out: Path) -> dict[str, Report]:
    """Every ``*.json`` in ``results``; charts (``<name>.png``) are copied beside the page."""
    reports: dict[str, Report] = {}
    for path in sorted(results.glob("*.json")):
        report = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(report, dict):
            continue
        chart = path.with_suffix(".png")
        if chart.is_file():
            shutil.copyfile(chart, out.parent / chart.name)
            report["chart"] = chart.name
        reports[path.stem] = report
    return reports


def register(commands: Any) -> None:
    """``figures`` (write the page) and ``stamp`` (record a run's date and commit)."""
    figures = commands.add_parser("figures", help="write the figures page from the results")
    figures.add_argument("--results", type=Path, default=ROOT / "bench-results")
    figures.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "figures.md")
    figures.set_defaults(run=_figures)
    stamps = commands.add_parser("stamp", help="record the date and commit in a result's JSON")
    stamps.add_argument("files", nargs="+", type=Path)
    stamps.set_defaults(run=_stamp)


def _stamp(args: argparse.Namespace) -> int:
    for path in args.files:
        stamp(path)
    return 0


def _figures(args: argparse.Namespace) -> int:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    reports = load_reports(args.results, args.out) if args.results.is_dir() else {}
    previous = args.out.read_text(encoding="utf-8") if args.out.is_file() else ""
    args.out.write_text(render_page(reports, previous=previous), encoding="utf-8")
    print(f"wrote {args.out} ({len(reports)} benchmark(s))", file=sys.stderr)
    return 0
