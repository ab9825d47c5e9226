"""The bench's report: the windows runs.py measured, turned into figures, tables and a JSON file.

Per part: medians per mode over the alternated rounds, ratios to the untraced baseline, the
agent's CPU per request and the kernel tax, the highest loss-free rate of a sweep. Over the whole
run: a flat ``headline`` (what bench/compare.py diffs between two reports), the issue's targets as
MET / NOT MET (for reference: nothing here fails a build), a printed summary, and every window with
all its counters written as JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
from pathlib import Path
from typing import Any, Callable

from .checkout import RESULTS_DIR
from .console import say
from .pinning import Layout
from .procfs import NOISY_CORES

# --------------------------------------------------------------------------------------
# numbers and tables
# --------------------------------------------------------------------------------------


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def fmt(value: Any, spec: str = ",.0f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def table(headers: list[str], rows: list[list[Any]], indent: str = "  ") -> str:
    cells = [[str(c) for c in row] for row in [headers, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append(indent + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            lines.append(indent + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def strip_private(row: dict[str, Any]) -> dict[str, Any]:
    """A window as the JSON report keeps it: without the keys only the run uses (``_rps``)."""
    return {k: v for k, v in row.items() if not k.startswith("_")}


# --------------------------------------------------------------------------------------
# one window, as printed when it ends
# --------------------------------------------------------------------------------------


def describe_window(w: dict[str, Any]) -> str:
    wrk = w["wrk"]
    lat = wrk["latency_us"]
    cpu = w["cpu"]
    parts = []
    if "round" in w:
        parts.append(f"round {w['round']} {w['mode']:<5}")
    elif "config" in w:
        parts.append(w["config"])
    elif "mode" in w:
        parts.append(f"{w['mode']:<5}")
    if "target_rps" in w:
        parts.append(f"target {w['target_rps']:>6,}")
    parts.append(f"{wrk['rps']:>9,.0f} req/s")
    parts.append(f"p50 {lat['p50']:>6,} us p99 {lat['p99']:>7,} us")
    if "late_pct" in wrk and wrk["late_pct"]:
        parts.append(f"late {wrk['late_pct']}%")
    errors = sum(wrk["errors"].values())
    if errors:
        parts.append(f"wrk errors {wrk['errors']}")
    parts.append(f"nginx {cpu['nginx_cores']:.2f} cores")
    if "agent_cores" in cpu:
        parts.append(f"agent {cpu['agent_cores']:.2f} cores" + (f" {w['agent_us_per_request']:.1f} us/req" if w.get("agent_us_per_request") is not None else "") + (" (stopped)" if w.get("agent_frozen") else ""))
    parts.append("cpus " + "/".join(f"{v:.0%}" for k, v in sorted(cpu["cpu_busy"].items()) if k != "cpu"))
    if cpu.get("other_cores", 0) > NOISY_CORES:
        parts.append(f"NOISE: other processes used {cpu['other_cores']:.2f} cores")
    if w.get("agent_caught_up_after_s", 0) > 1.0:
        parts.append(f"agent busy {w['agent_caught_up_after_s']:.0f}s after load")
    if "spans_exported" in w:
        verdict = "OK" if w["loss_free"] else ("EXTRA SPANS" if w["spans_missing"] < 0 else "LOSS")
        parts.append(
            f"spans {w['spans_exported']:,}/{w['nginx_served']:,} (lost ev {w['events_lost']:,}, dropped {w['export_dropped']:,}) {verdict}"
        )
    return " | ".join(parts)


# --------------------------------------------------------------------------------------
# the parts: windows -> results, and the line that says them
# --------------------------------------------------------------------------------------


def per_mode(rows: list[dict[str, Any]], modes: list[str]) -> dict[str, dict[str, Any]]:
    """Medians (and span totals) per mode over alternated rounds."""
    out: dict[str, dict[str, Any]] = {}
    for m in modes:
        mr = [r for r in rows if r["mode"] == m]
        entry: dict[str, Any] = {
            "windows": len(mr),
            "median_rps": round(median([r["_rps"] for r in mr]), 1),
            "rps": [round(r["_rps"], 1) for r in mr],
            "median_p50_us": median([r["wrk"]["latency_us"]["p50"] for r in mr]),
            "median_p99_us": median([r["wrk"]["latency_us"]["p99"] for r in mr]),
            "median_nginx_cores": median([r["cpu"]["nginx_cores"] for r in mr]),
            "median_nginx_us_per_request": median([r["nginx_us_per_request"] for r in mr if "nginx_us_per_request" in r]),
            "median_cpu_busy": {c: median([r["cpu"]["cpu_busy"].get(c, 0) for r in mr]) for c in sorted(mr[0]["cpu"]["cpu_busy"])} if mr else {},
        }
        if any("agent_cores" in r["cpu"] for r in mr):
            entry["median_agent_cores"] = median([r["cpu"].get("agent_cores", 0) for r in mr])
            entry["median_agent_us_per_request"] = median([r["agent_us_per_request"] for r in mr if "agent_us_per_request" in r])
            entry["max_agent_vmhwm_mb"] = max((r.get("agent_vmhwm_mb", 0) for r in mr), default=None)
            entry["events_lost"] = sum(r.get("events_lost", 0) for r in mr)
        if any("spans_exported" in r for r in mr):
            served = sum(r["nginx_served"] for r in mr)
            spans = sum(r["spans_exported"] for r in mr)
            entry.update(
                served=served, spans=spans, spans_per_request=round(spans / served, 4) if served else None,
                export_dropped=sum(r["export_dropped"] for r in mr), loss_free_windows=sum(1 for r in mr if r["loss_free"]),
            )
            created = sum(r["spans_created"] for r in mr)
            # the compiled fast path's share of the spans (otelbpf.fastpath.exchanges / otelbpf.spans.created)
            entry["fast_path_share"] = round(sum(r["fast_path_exchanges"] for r in mr) / created, 4) if created else None
        out[m] = entry
    return out


def paired_ratio(rows: list[dict[str, Any]], mode: str) -> float | None:
    """Median over rounds of (mode's req/s / off's req/s in the same round): a second estimator, robust to drift."""
    ratios = []
    for rnd in sorted({r["round"] for r in rows}):
        off = [r["_rps"] for r in rows if r["round"] == rnd and r["mode"] == "off"]
        other = [r["_rps"] for r in rows if r["round"] == rnd and r["mode"] == mode]
        if off and other and off[0]:
            ratios.append(other[0] / off[0])
    return round(statistics.median(ratios), 3) if ratios else None


def saturation_result(rows: list[dict[str, Any]], args: argparse.Namespace, modes: dict[str, str]) -> dict[str, Any]:
    """The saturation part: req/s per mode (``modes``: mode -> description), ratios to off, spread."""
    per = per_mode(rows, list(modes))
    off = per["off"]["median_rps"]
    off_values = per["off"]["rps"]
    return {
        "wrk": {"threads": args.threads, "connections": args.connections, "duration_s": args.duration, "paths": args.paths},
        "modes": modes,
        "sink": args.sink,
        "rounds": [strip_private(r) for r in rows],
        "per_mode": per,
        "median_rps": {m: per[m]["median_rps"] for m in modes},
        "ratio_to_off": {m: round(per[m]["median_rps"] / off, 3) for m in modes if m != "off" and off},
        "paired_ratio_to_off": {m: paired_ratio(rows, m) for m in modes if m != "off"},
        "off_spread_pct": round(100.0 * (max(off_values) - min(off_values)) / off, 1) if len(off_values) > 1 and off else None,
        "noisy_windows": sum(1 for r in rows if r["noisy"]),
    }


def say_saturation(s: dict[str, Any]) -> None:
    per = s["per_mode"]
    say("  => median req/s: " + ", ".join(f"{m} {fmt(per[m]['median_rps'])}" for m in s["modes"]) + "; ratios to off: " + ", ".join(f"{m} {v:.3f}x" for m, v in s["ratio_to_off"].items()))


def fixed_rate_result(rows: list[dict[str, Any]], args: argparse.Namespace, rate: int) -> dict[str, Any]:
    """The half-load part: latency per mode at a fixed rate, added p50/p99, the generator's late share."""
    modes = args.half_modes

    def med(mode: str, key: str) -> float | None:
        return median([r["wrk"]["latency_us"][key] for r in rows if r["mode"] == mode])

    per = per_mode(rows, modes)
    traced = [m for m in modes if m != "off"]
    return {
        "target_rps": rate,
        "connections": args.rate_connections,
        "sink": args.sink,
        "rounds": [strip_private(r) for r in rows],
        "per_mode": per,
        "median_rps": {m: per[m]["median_rps"] for m in modes},
        "median_latency_us": {m: {k: med(m, k) for k in ("p50", "p90", "p99", "p999", "max")} for m in modes},
        "added_p50_us": {m: med(m, "p50") - med("off", "p50") for m in traced},
        "added_p99_us": {m: med(m, "p99") - med("off", "p99") for m in traced},
        "p99_ratio": {m: round(med(m, "p99") / med("off", "p99"), 2) if med("off", "p99") else None for m in traced},
        "late_pct_max": max((r["wrk"].get("late_pct", 0) for r in rows), default=0),
        "late_pct_median": {m: median([r["wrk"].get("late_pct", 0) for r in rows if r["mode"] == m]) for m in modes},
        "noisy_windows": sum(1 for r in rows if r["noisy"]),
    }


def say_fixed_rate(f: dict[str, Any]) -> None:
    p99 = {m: lat["p99"] for m, lat in f["median_latency_us"].items()}
    for m in f["added_p99_us"]:
        say(f"  => {m}: p99 off {fmt(p99['off'])} us, {m} {fmt(p99[m])} us: added p99 {fmt(f['added_p99_us'][m], '+,.0f')} us (x{f['p99_ratio'][m]}); spans/requests {fmt(f['per_mode'][m].get('spans_per_request'), '.4f')}")
    if f["late_pct_max"] > 1:
        say(f"  !! the generator fell behind its schedule ({f['late_pct_max']}% of requests late): nginx did not keep up, the rate was not held and the latencies above are under-reported (coordinated omission)")


def cost_result(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The cost part: agent CPU per request per mode, and the kernel tax (nginx's CPU per request, traced - untraced)."""
    per = per_mode(rows, args.cost_modes)
    off_ng = per["off"]["median_nginx_us_per_request"] if "off" in per else None
    out: dict[str, Any] = {"target_rps": args.cost_rate, "sink": args.sink, "rounds": [strip_private(r) for r in rows], "per_mode": per}
    if off_ng is not None:
        out["kernel_tax_us_per_request"] = {m: round(per[m]["median_nginx_us_per_request"] - off_ng, 2) for m in per if m != "off" and per[m]["median_nginx_us_per_request"] is not None}
    return out


def say_cost(c: dict[str, Any]) -> None:
    per = c["per_mode"]
    say("  => " + "; ".join(
        f"{m}: {fmt(per[m]['median_rps'])} req/s, nginx {fmt(per[m]['median_nginx_us_per_request'], '.1f')} us/req"
        + (f", agent {fmt(per[m].get('median_agent_us_per_request'), '.1f')} us/req ({fmt(per[m].get('median_agent_cores'), '.2f')} cores), spans/requests {fmt(per[m].get('spans_per_request'), '.4f')}, events lost {per[m].get('events_lost', 0):,}" if m != "off" else "")
        for m in per))
    if "kernel_tax_us_per_request" in c:
        say("  => kernel tax seen from nginx (its CPU per request, traced minus untraced): " + ", ".join(f"{m} {v:+.1f} us" for m, v in c["kernel_tax_us_per_request"].items()))


def bpf_mode_result(window: dict[str, Any], res: dict[str, Any]) -> dict[str, Any]:
    """One bpf window: bpf_stats.delta's figures (``res``, completed here) with the window beside them."""
    res["wall_s"] = window["cpu"]["wall_s"]
    res["nginx_cpu_s"] = window["cpu"]["nginx_cpu_s"]
    res["bpf_share_of_nginx_cpu"] = round(res["total_ns"] / 1e9 / window["cpu"]["nginx_cpu_s"], 3) if window["cpu"]["nginx_cpu_s"] else None
    window.pop("probe", None)
    return {"window": strip_private(window), **res}


def say_bpf_mode(mode: str, description: str, res: dict[str, Any]) -> None:
    say(f"  mode {mode} ({description}): {res['total_ns'] / 1e6:,.1f} ms of BPF in {res['wall_s']:.1f}s = {fmt(res.get('total_ns_per_request'), ',.0f')} ns per request served, {fmt(res['bpf_share_of_nginx_cpu'], '.1%')} of nginx's CPU (BPF also runs in other processes' syscalls)")


def bpf_above_floor(out: dict[str, Any], floor_ns_per_run: float) -> None:
    """The programs' work per request apart from the timing's own cost (``floor_ns_per_run``), per mode."""
    out["floor_ns_per_run"] = floor_ns_per_run
    for mode in ("idle", "on"):
        res = out.get(mode)
        if res and res.get("total_runs_per_request") is not None and floor_ns_per_run:
            above = res["total_ns_per_request"] - floor_ns_per_run * res["total_runs_per_request"]
            res["ns_per_request_above_floor"] = round(max(0.0, above), 1)
            say(f"  mode {mode}: {above:,.0f} ns per request above the timing floor ({floor_ns_per_run} ns per run: an empty program on sock_send_length, dispatch + two clock reads)")


def loss_sweep_result(sink: str, where: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One sweep configuration: its windows by rate and the highest loss-free rate."""
    passed = [r["target_rps"] for r in runs if r["loss_free"]]
    failed = [r["target_rps"] for r in runs if not r["loss_free"]]
    highest = max(passed, default=None)
    return {
        "sink": sink,
        "agent": where,
        "runs": [strip_private(r) for r in runs],
        "highest_loss_free_rps": highest,
        "lowest_lossy_rps": min(failed, default=None),
        "monotonic": not failed or highest is None or highest < min(failed),
    }


def say_loss_sweep(config: str, data: dict[str, Any]) -> None:
    say(f"  => {config}: highest loss-free rate {fmt(data['highest_loss_free_rps'])} req/s" + ("" if data["monotonic"] else " (a lower rate lost spans: noisy or unstable, see the runs)"))


def agent_cost(results: dict[str, Any]) -> None:
    """The agent's CPU and memory at the sweep's highest loss-free rate and at 10k, as a table and as results["agent_cost"]."""
    sweep = results.get("loss_sweep")
    if not sweep:
        return
    say("\n[loss] agent CPU and memory in the sweep's runs")
    out: dict[str, Any] = {}
    rows = []
    for config, data in sweep.items():
        picks = {"highest_loss_free": data["highest_loss_free_rps"], "at_10k": 10000}
        if picks["highest_loss_free"] == 10000:
            picks = {"highest_loss_free_and_10k": 10000}
        for label, rate in picks.items():
            run = next((r for r in data["runs"] if r["target_rps"] == rate), None)
            if run is None:
                continue
            entry = {
                "rate": rate,
                "achieved_rps": run["wrk"]["rps"],
                "agent_cores": run["cpu"].get("agent_cores"),
                "agent_us_per_request": run.get("agent_us_per_request"),
                "nginx_cores": run["cpu"].get("nginx_cores"),
                "agent_vmhwm_mb": run.get("agent_vmhwm_mb"),
                "loss_free": run["loss_free"],
            }
            out[f"{config}/{label}"] = entry
            rows.append([f"{config} @ {rate:,} ({label.replace('_', ' ')})", fmt(entry["achieved_rps"]), fmt(entry["agent_cores"], ".2f"), fmt(entry["agent_us_per_request"], ".1f"), fmt(entry["nginx_cores"], ".2f"), fmt(entry["agent_vmhwm_mb"], ".0f"), "yes" if entry["loss_free"] else "NO"])
    say(table(["run", "req/s", "agent cores", "agent us/req", "nginx cores", "VmHWM MB", "loss-free"], rows))
    results["agent_cost"] = out


def startup_result(runs: list[dict[str, Any]], idle_cores: float | None) -> dict[str, Any]:
    """The startup part: medians over the agent's starts."""
    return {
        "idle_agent_cores": idle_cores,
        "runs": runs,
        "median_to_tracing_s": round(median([r["to_tracing_s"] for r in runs]), 2),
        "median_self_reported_s": median([r["self_reported_s"] for r in runs if r["self_reported_s"] is not None]),
        "median_stop_s": round(median([r["stop_s"] for r in runs]), 2),
        "median_idle_vmhwm_mb": median([r["vmhwm_mb"] for r in runs]),
    }


# --------------------------------------------------------------------------------------
# the whole run: headline, targets, summary, JSON
# --------------------------------------------------------------------------------------


def headline(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The figures the issue asks for, flat: key -> {label, value, unit, better}. compare.py diffs these."""
    r = results
    h: dict[str, dict[str, Any]] = {}

    def put(key: str, label: str, value: Any, unit: str, better: str) -> None:
        if value is not None:
            h[key] = {"label": label, "value": value, "unit": unit, "better": better}

    sat = r.get("saturation")
    if sat:
        per = sat["per_mode"]
        put("sat.off_rps", "saturation: untraced nginx req/s", per["off"]["median_rps"], "req/s", "higher")
        for m, label in (("on", "agent on nginx's core"), ("own", "agent on its own core"), ("idle", "probes attached, tracing nothing"), ("kstop", "kernel capture, user space stopped"), ("drop", "kernel capture, user space reading and dropping")):
            if m in per:
                put(f"sat.ratio.{m}", f"saturation ratio {m}/off ({label})", sat["ratio_to_off"].get(m), "x", "higher")
                if "spans_per_request" in per[m]:
                    put(f"sat.spans_per_request.{m}", f"saturation spans/requests, {m}", per[m]["spans_per_request"], "", "higher")
                if m in ("on", "own"):
                    put(f"sat.agent_cores.{m}", f"saturation agent cores, {m}", per[m].get("median_agent_cores"), "cores", "lower")
    fr = r.get("fixed_rate")
    if fr:
        for m, v in fr["added_p99_us"].items():
            put(f"half.added_p99_us.{m}", f"half load ({fr['target_rps']:,}/s): added p99, {m}", v, "us", "lower")
            put(f"half.spans_per_request.{m}", f"half load: spans/requests, {m}", fr["per_mode"][m].get("spans_per_request"), "", "higher")
    cost = r.get("cost")
    if cost:
        for m, e in cost["per_mode"].items():
            if m == "off":
                put("cost.nginx_us_per_request.off", f"{cost['target_rps']:,}/s: nginx CPU per request, untraced", e["median_nginx_us_per_request"], "us", "lower")
                continue
            put(f"cost.agent_us_per_request.{m}", f"{cost['target_rps']:,}/s: agent CPU per request, {m}", e.get("median_agent_us_per_request"), "us", "lower")
            put(f"cost.kernel_tax_us_per_request.{m}", f"{cost['target_rps']:,}/s: kernel tax (nginx CPU/request, traced - untraced), {m}", (cost.get("kernel_tax_us_per_request") or {}).get(m), "us", "lower")
            put(f"cost.spans_per_request.{m}", f"{cost['target_rps']:,}/s: spans/requests, {m}", e.get("spans_per_request"), "", "higher")
            put(f"cost.events_lost.{m}", f"{cost['target_rps']:,}/s: events lost, {m}", e.get("events_lost"), "", "lower")
    b = r.get("bpf")
    if b:
        for m in ("idle", "on"):
            if m in b:
                put(f"bpf.ns_per_request.{m}", f"{b['target_rps']:,}/s: BPF run time per request, {m}", b[m].get("total_ns_per_request"), "ns", "lower")
    for config, data in (r.get("loss_sweep") or {}).items():
        put(f"loss.highest_loss_free_rps.{config}", f"highest loss-free rate, {config}", data["highest_loss_free_rps"], "req/s", "higher")
    hwm = [w.get("agent_vmhwm_mb") for w in all_windows(results) if w.get("agent_vmhwm_mb")]
    put("rss.peak_mb", "agent peak RSS (VmHWM), max over every window", max(hwm) if hwm else None, "MB", "lower")
    if cost and cost["per_mode"].get("on", {}).get("max_agent_vmhwm_mb"):
        put("rss.peak_mb.cost_on", f"agent peak RSS at {cost['target_rps']:,}/s, on", cost["per_mode"]["on"]["max_agent_vmhwm_mb"], "MB", "lower")
    st = r.get("startup")
    if st:
        put("startup.to_tracing_s", "start-up: exec -> 'otelbpf: tracing'", st["median_to_tracing_s"], "s", "lower")
        put("startup.self_reported_s", "start-up: the agent's own figure", st["median_self_reported_s"], "s", "lower")
        put("startup.idle_vmhwm_mb", "agent RSS (VmHWM) idle", st["median_idle_vmhwm_mb"], "MB", "lower")
    return h


def all_windows(results: dict[str, Any]):
    """Every window of the run that measured nginx under load (bpf and start-up windows aside)."""
    r = results
    for part in ("saturation", "fixed_rate", "cost"):
        yield from (r.get(part) or {}).get("rounds", [])
    for data in (r.get("loss_sweep") or {}).values():
        yield from data["runs"]


def issue_targets(results: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The issue's targets, for reference (nothing here fails: numbers, not asserts)."""
    h = results.get("headline") or headline(results)
    targets = []

    def add(target: str, key: str, ok: Callable[[Any], bool], show: Callable[[Any], str]) -> None:
        if key in h:
            v = h[key]["value"]
            targets.append({"target": target, "key": key, "value": show(v), "met": bool(ok(v))})

    add("probes attached, nothing traced >= 0.99x of untraced nginx (saturation idle/off)", "sat.ratio.idle", lambda v: v >= 0.99, lambda v: f"{v:.3f}x")
    add("traced, user space dropping everything >= 0.95x (drop/off: the agent reads every record and drops it, --discard-events)", "sat.ratio.drop", lambda v: v >= 0.95, lambda v: f"{v:.3f}x")
    add("traced, user space stopped (kstop/off: the kernel drops once the ring is full; a lower bound of the capture's cost)", "sat.ratio.kstop", lambda v: v >= 0.95, lambda v: f"{v:.3f}x")
    sink = args.sink
    add(f"<= 10 us agent CPU per request at {args.cost_rate:,}/s, agent on nginx's core (sink {sink}; the issue means OTLP on)", "cost.agent_us_per_request.on", lambda v: v <= 10, lambda v: f"{v:.1f} us")
    if "cost.spans_per_request.on" in h:
        e = results["cost"]["per_mode"]["on"]
        targets.append({"target": f"zero span loss at {args.cost_rate:,}/s, agent on nginx's core (cost windows)", "key": "cost.spans_per_request.on",
                        "value": f"{e['spans']:,}/{e['served']:,} spans, events lost {e['events_lost']:,}, {e['loss_free_windows']}/{e['windows']} windows loss-free",
                        "met": e["loss_free_windows"] == e["windows"]})
    for config, data in (results.get("loss_sweep") or {}).items():
        for rate, where in ((10000, "server"), (50000, "own")):
            if data["agent"] != where:
                continue
            run = next((x for x in data["runs"] if x["target_rps"] == rate), None)
            value = f"highest loss-free {fmt(data['highest_loss_free_rps'])} req/s" + (f"; at {rate:,}: {run['spans_exported']:,}/{run['nginx_served']:,} spans, events lost {run['events_lost']:,}" if run else f"; {rate:,} not run")
            targets.append({"target": f"zero span loss at {rate:,}/s ({config})", "key": f"loss.highest_loss_free_rps.{config}", "value": value, "met": bool(run and run["loss_free"])})
    return targets


def print_summary(results: dict[str, Any], args: argparse.Namespace) -> None:
    """The summary printed at the end of a run: one table per part, the headline, the targets."""
    r = results
    say("\n" + "=" * 100)
    say("SUMMARY  (" + r["machine"]["summary"] + ")")
    au = r.get("agent_under_test", {})
    say(f"agent under test: {' '.join(au.get('argv', []))} in {au.get('cwd')} (commit {au.get('commit', '')[:12]}, {au.get('modified_files')} modified files)   label: {r.get('label')}")
    say(f"layout: {r['layout']['description']}")
    if r.get("saturation"):
        _print_saturation(r["saturation"], args.rounds)
    if r.get("fixed_rate"):
        _print_fixed_rate(r["fixed_rate"])
    if r.get("cost"):
        _print_cost(r["cost"])
    if r.get("bpf"):
        _print_bpf(r["bpf"])
    for config, data in (r.get("loss_sweep") or {}).items():
        _print_loss_sweep(config, data)
    st = r.get("startup")
    if st:
        say(f"\nstart-up to tracing: median {st['median_to_tracing_s']}s (agent's own compile+attach {st['median_self_reported_s']}s); stop {st['median_stop_s']}s; idle VmHWM {st['median_idle_vmhwm_mb']} MB, idle CPU {fmt(st['idle_agent_cores'], '.3f')} cores")
    say("\nheadline (compare two reports with bench/compare.py BEFORE.json AFTER.json):")
    say(table(["figure", "value", "unit"], [[v["label"], fmt(v["value"], ",.3f" if isinstance(v["value"], float) and abs(v["value"]) < 10 else ",.0f" if isinstance(v["value"], (int, float)) else ""), v["unit"]] for v in r.get("headline", {}).values()]))
    say("\nthe issue's targets (reference only, nothing is asserted):")
    for t in r.get("targets", []):
        say(f"  [{'MET' if t['met'] else 'NOT MET'}] {t['target']}: {t['value']}")


def _print_saturation(sat: dict[str, Any], rounds: int) -> None:
    say(f"\nsaturation (wrk closed loop; median of {rounds} alternated rounds; sink {sat['sink']}):")
    rows = []
    for m, e in sat["per_mode"].items():
        rows.append([m, fmt(e["median_rps"]), "1" if m == "off" else f"{sat['ratio_to_off'][m]:.3f}", "" if m == "off" else fmt(sat["paired_ratio_to_off"].get(m), ".3f"),
                     fmt(e["median_nginx_cores"], ".2f"), fmt(e.get("median_agent_cores"), ".2f"), "/".join(f"{v:.0%}" for k, v in e["median_cpu_busy"].items() if k != "cpu"),
                     fmt(e.get("spans_per_request"), ".4f"), fmt(e.get("events_lost"), ","), fmt(e["median_p99_us"]), " ".join(fmt(v) for v in e["rps"])])
    say(table(["mode", "req/s", "x off", "paired", "nginx cores", "agent cores", "cpu busy", "spans/req", "ev lost", "p99 us", "raw req/s per round"], rows))
    say(f"  off rounds spread {fmt(sat['off_spread_pct'], '.1f')}%; noisy windows kept: {sat['noisy_windows']} of {len(sat['rounds'])}")


def _print_fixed_rate(fr: dict[str, Any]) -> None:
    say(f"\nhalf load: fixed {fr['target_rps']:,} req/s (open loop, sink {fr['sink']}):")
    rows = []
    for m, e in fr["per_mode"].items():
        lat = fr["median_latency_us"][m]
        rows.append([m, fmt(e["median_rps"]), fmt(lat["p50"]), fmt(lat["p99"]), "" if m == "off" else fmt(fr["added_p99_us"][m], "+,.0f"), fmt(fr["late_pct_median"][m], ".2f"), fmt(e.get("spans_per_request"), ".4f"), fmt(e.get("median_agent_cores"), ".2f")])
    say(table(["mode", "req/s", "p50 us", "p99 us", "added p99 us", "late %", "spans/req", "agent cores"], rows))
    if fr["late_pct_max"] > 1:
        say("  (rate not held in some window: latency under-reported)")


def _print_cost(cost: dict[str, Any]) -> None:
    say(f"\nagent cost at {cost['target_rps']:,} req/s (sink {cost['sink']}; median of alternated rounds):")
    rows = []
    tax = cost.get("kernel_tax_us_per_request") or {}
    for m, e in cost["per_mode"].items():
        rows.append([m, fmt(e["median_rps"]), fmt(e.get("median_agent_us_per_request"), ".1f"), fmt(e.get("median_agent_cores"), ".2f"), fmt(e["median_nginx_us_per_request"], ".1f"), fmt(tax.get(m), "+.1f"),
                     fmt(e.get("spans_per_request"), ".4f"), fmt(e.get("fast_path_share"), ".3f"), fmt(e.get("events_lost"), ","), fmt(e.get("max_agent_vmhwm_mb"), ".0f")])
    say(table(["mode", "req/s", "agent us/req", "agent cores", "nginx us/req", "kernel tax us/req", "spans/req", "fast share", "ev lost", "VmHWM MB"], rows))


def _print_bpf(b: dict[str, Any]) -> None:
    say(f"\nBPF programs at {b['target_rps']:,} req/s (kernel.bpf_stats_enabled):")
    for m in ("idle", "on"):
        if m in b:
            say(f"  {m}: {fmt(b[m].get('total_ns_per_request'), ',.0f')} ns of BPF per request ({fmt(b[m].get('total_runs_per_request'), '.1f')} runs); top: " + ", ".join(f"{p['name']} {fmt(p.get('ns_per_request'), ',.0f')} ns/req ({fmt(p['ns_per_run'], ',.0f')} ns/run)" for p in b[m]["programs"][:4]))


def _print_loss_sweep(config: str, data: dict[str, Any]) -> None:
    rows = [[f"{x['target_rps']:,}", fmt(x["wrk"]["rps"]), f"{x['nginx_served']:,}", f"{x['spans_exported']:,}", f"{x['loss_pct']:.2f}%", f"{x['events_lost']:,}", f"{x['export_dropped']:,}", fmt(x["cpu"].get("agent_cores"), ".2f"), fmt(x.get("agent_us_per_request"), ".1f"), fmt(x["cpu"].get("nginx_cores"), ".2f"), fmt(x.get("agent_vmhwm_mb"), ".0f"), "yes" if x["loss_free"] else "NO", f"{x['cpu']['other_cores']:.2f}" + (" !" if x["noisy"] else "")] for x in data["runs"]]
    say(f"\nspan loss, {config}: highest loss-free rate {fmt(data['highest_loss_free_rps'])} req/s")
    say(table(["target/s", "achieved/s", "served", "spans", "loss", "ev lost", "dropped", "agent cores", "agent us/req", "nginx cores", "HWM MB", "loss-free", "noise cores"], rows))


def run_description(args: argparse.Namespace, layout: Layout, agent: dict[str, Any], machine: dict[str, Any],
                    command: list[str], started: dt.datetime, busy: float) -> dict[str, Any]:
    """What a report says about its run before any figure: machine, command, configuration, pinning, agent."""
    return {
        "machine": machine,
        "started": started.isoformat(timespec="seconds"),
        "command": command,
        "config": {k: (sorted(v) if isinstance(v, set) else str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "layout": {"server": layout.server, "client": layout.client, "agent": layout.agent, "agent_own": layout.agent_own, "description": layout.describe()},
        "agent_under_test": agent,
        "label": args.label or (agent.get("commit") or "")[:12] or "unlabelled",
        "idle_before_start": busy,
    }


def say_run_header(results: dict[str, Any]) -> None:
    say(f"otelbpf nginx/wrk benchmark -- {results['machine']['summary']}")
    au = results["agent_under_test"]
    say(f"agent under test [{results['label']}]: {' '.join(au['argv'])} run ... (in {au['cwd']}, commit {au['commit'][:12]} {au['commit_subject'][:60]!r}, {au['modified_files']} modified files)")
    busy = results["idle_before_start"]
    if busy > 0.10:
        say(f"WARNING: the machine was {busy:.0%} busy before the benchmark started: other work skews the numbers (alternation limits, does not remove, the effect)")


def conclude(results: dict[str, Any], args: argparse.Namespace, noise_spent: float) -> None:
    """After the last part: the headline, the targets and what noise cost the run."""
    results["headline"] = headline(results)
    results["targets"] = issue_targets(results, args)
    results["noise"] = {"threshold_cores": NOISY_CORES, "seconds_spent": round(noise_spent, 1)}


def default_path(started: dt.datetime) -> Path:
    return RESULTS_DIR / f"nginx_wrk-{started.strftime('%Y%m%d-%H%M%S')}.json"


def finish(results: dict[str, Any], args: argparse.Namespace, started: dt.datetime) -> None:
    """Once every child has stopped: the summary printed, the report written as JSON."""
    finished = dt.datetime.now(dt.timezone.utc)
    results["finished"] = finished.isoformat(timespec="seconds")
    results["elapsed_s"] = round((finished - started).total_seconds(), 1)
    print_summary(results, args)
    path = args.output or default_path(started)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    say(f"\nreport written to {path} ({results['elapsed_s']:.0f}s)")
