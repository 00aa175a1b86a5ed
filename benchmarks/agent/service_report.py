"""The text of ``python -m benchmarks service``'s report (see :mod:`.service`)."""

from __future__ import annotations

from typing import Any

from edge_core.report import render_table

__all__ = ["format_service"]


def _met(value: bool) -> str:
    return "met" if value else "NOT met"


def _format_overhead(overhead: dict[str, Any]) -> list[str]:
    base = overhead["paths"]["in-process"]
    rows = [
        [name, s["p50_ms"], s["p99_ms"], s["mean_ms"],
         round(s["p50_ms"] - base["p50_ms"], 3), round(s["p99_ms"] - base["p99_ms"], 3)]
        for name, s in overhead["paths"].items()
    ]  # fmt: skip
    return [
        f"1. local API overhead: digits-light ({overhead['variant']['daemon']}), 1 row, "
        f"{overhead['requests']} requests each after {overhead['warmup']}, interleaved "
        f"(same outputs: {overhead['same_outputs']})",
        render_table(["path", "p50 ms", "p99 ms", "mean ms", "+p50 ms", "+p99 ms"], rows),
        f"HTTP: {overhead['http']}; gRPC: {overhead['grpc']}",
    ]


def _format_startup(report: dict[str, Any]) -> list[str]:
    startup = report["startup"]
    rows = [
        [name, s["ready_median_s"], s["ready_max_s"], s["own_start_median_s"],
         s["rss_median_mb"], s["rss_anon_median_mb"], s["rss_file_median_mb"],
         s["variants"].get("digits-light"), _met(s["rss_target_met"]), _met(s["ready_target_met"])]
        for name, s in startup.items()
    ]  # fmt: skip
    headers = ["config", "READY med s", "READY max s", "own start s", "RSS MB", "anon MB",
               "file MB", "variant", "RSS <= 80 MB", "READY <= 1.5 s"]  # fmt: skip
    first = next(iter(startup.values()))
    return [
        f"2. startup and idle RSS: {report['profile']}, one model, {first['starts']} starts "
        f"each, VmRSS after {report['settings']['idle_s']:g} s idle",
        render_table(headers, rows),
        "READY: Popen to READY=1 on the notify socket, the max held to the target; own start: "
        "the daemon's own `ready in` (the rest is the interpreter and the imports)",
        f"everything on: gRPC, HTTP offload to a gateway, MQTT: {report['mqtt']}",
    ]


def _format_imports(report: dict[str, Any]) -> list[str]:
    imports = report["imports"]
    names = list(imports["present"])
    added = imports["added_mb"]
    shown = [group for group, mb in added.items() if mb >= 0.8]
    rest = round(sum(mb for group, mb in added.items() if group not in shown), 1)
    stdlib = round(sum(mb for group, mb in added.items() if group.endswith("(stdlib)")), 1)
    rows = [
        [group, round(added[group], 1),
         *["yes" if group in imports["present"][n] else "-" for n in names]]
        for group in shown
    ]  # fmt: skip
    rows.append([f"{len(added) - len(shown)} others", rest, *[""] * len(names)])
    daemon = report["startup"][imports["measured_on"]]["rss_median_mb"]
    return [
        f"what imports add to RSS: the {imports['measured_on']} daemon's modules imported "
        "again in a fresh interpreter, package by package, dependencies first",
        render_table(["package", "+MB", *names], rows),
        f"interpreter {imports['interpreter_mb']} MB + imports (standard library {stdlib} MB) = "
        f"{imports['total_mb']} MB of the daemon's {daemon} MB; the rest: the model, threads, "
        "servers, buffers",
    ]


def _format_soak(soak: dict[str, Any]) -> list[str]:
    rows = [
        [kind, k.get("sent", 0), k.get("device", 0), k.get("cloud", 0), k.get("cache", 0),
         k.get("refused", 0), k.get("error", 0), k.get("degraded", 0), k["p50_ms"], k["p99_ms"]]
        for kind, k in soak["by_kind"].items()
    ]  # fmt: skip
    headers = ["request", "sent", "device", "cloud", "cache", "refused", "errors", "degraded",
               "p50 ms", "p99 ms"]  # fmt: skip
    published = soak["published"]
    under_load = (
        f" ({soak['rss_growth_under_load_mb']:+g} from the first sample under load at "
        f"{soak['rss_samples'][1][0]:g} s)"
        if soak["rss_growth_under_load_mb"] is not None
        else " (too short a soak for a sample under load)"
    )
    return [
        f"3. soak: {soak['seconds']:g} s, {soak['threads']['http']} HTTP + "
        f"{soak['threads']['grpc']} gRPC client threads, the everything-on daemon "
        "(digits-heavy is cloud only)",
        render_table(headers, rows),
        f"{soak['requests']} requests, {soak['requests_per_s']:g}/s, {soak['errors']} errors; "
        f"the daemon counted {soak['daemon_counted']}",
        "decisions: " + ", ".join(f"{k} {v}" for k, v in soak["by_decision"].items()),
        "published to the broker: "
        + (", ".join(f"{k} {v}" for k, v in sorted(published.items())) if published else "none")
        + f"; telemetry queue waiting at the end: {soak['telemetry_queue_waiting']}",
        f"RSS MB: start {soak['rss_start_mb']}, end {soak['rss_end_mb']}, max "
        f"{soak['rss_max_mb']}, growth {soak['rss_growth_mb']:+g}{under_load}; samples at "
        + ", ".join(f"{at:g} s: {v:g}" for at, v in soak["rss_samples"]),
    ]


def format_service(report: dict[str, Any]) -> str:
    lines = [*_format_overhead(report["overhead"]), "", *_format_startup(report)]
    if "imports" in report:
        lines += ["", *_format_imports(report)]
    lines += ["", *_format_soak(report["soak"])]
    return "\n".join(lines)
