#!/usr/bin/env python3
"""nginx under wrk, traced by otelbpf vs not: what tracing costs, and where it starts losing spans.

Run as root from the repository (``make bench`` does ``.venv/bin/python bench/nginx_wrk.py``)::

    .venv/bin/python bench/nginx_wrk.py                        # every part, ~12 min
    .venv/bin/python bench/nginx_wrk.py --quick                # smoke check, ~2 min
    .venv/bin/python bench/nginx_wrk.py --only cost,bpf        # some parts
    .venv/bin/python bench/nginx_wrk.py --repo ../base --label before   # another checkout's agent

Against an nginx it configures and starts itself on 127.0.0.1 (1 worker on CPU 0, wrk and the
counting OTLP receiver on CPU 1), in alternated rounds with the agent off:

* saturation: req/s per mode (off; idle = probes attached, nothing traced; on = agent on
  nginx's core; own = agent on its own core; kstop = agent stopped, the kernel drops), ratios
  to off, spans/requests;
* fixed (half load): added p50/p99 latency at half the untraced saturation rate;
* cost: at 10k req/s, the agent's CPU per request and the kernel tax (nginx's CPU per
  request, traced minus untraced);
* bpf: run time per BPF program (kernel.bpf_stats_enabled), ns per run and per request;
* loss: a sweep of fixed rates per configuration (agent on nginx's core / its own core):
  requests served vs SERVER spans delivered, the highest loss-free rate; agent CPU and VmHWM;
* startup: time from exec to the agent's "otelbpf: tracing" line.

The agent is driven through its command line and log lines only. The report is printed
and written as JSON to bench/results/; bench/compare.py diffs two reports (before -> after).
bench/README.md explains every number and the CPU pinning.

The workload drivers (nginx, wrk, the agent, the receiver, pinning, /proc) are in bench/wrkbench/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from wrkbench.agent import TRACING_PREFIX, AgentCommand, AgentLauncher, AgentRun, stat
from wrkbench.checkout import RESULTS_DIR
from wrkbench.console import BenchError, say
from wrkbench.machine import machine_info, preflight
from wrkbench.nginx import DEFAULT_PATHS, Nginx
from wrkbench.pinning import choose_layout
from wrkbench.processes import Children, free_port
from wrkbench.procfs import CLK_TCK, NOISY_CORES, CpuMeter, proc_cpu_ticks, proc_status_kb, system_busy_check
from wrkbench.span_counting import CountingReceiver, count_spans_in_json_file
from wrkbench.wrk import Wrk, WrkResult


class BpfProbe:
    """Snapshots of the agent's BPF program counters around a window's load (see bpf_stats.py)."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.before: dict = {}

    def begin(self, agent: Any) -> None:
        self.before = self.module.snapshot(agent.pid) if agent is not None else {}

    def end(self, agent: Any) -> dict:
        return {"after": self.module.snapshot(agent.pid) if agent is not None else {}}


# --------------------------------------------------------------------------------------
# small utilities
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


# --------------------------------------------------------------------------------------
# the benchmark
# --------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, children: Children, workdir: Path) -> None:
        self.args = args
        self.children = children
        self.workdir = workdir
        self.layout = choose_layout(args)
        self.nginx = Nginx(children, workdir, free_port(), args.workers, args.sendfile, self.layout.server)
        self.wrk: Wrk | None = None
        self.agent_command = AgentCommand.from_args(args)
        self.agents = AgentLauncher(children, self.layout.agent, args.agent_arg, self.agent_command)
        self.results: dict[str, Any] = {}
        self.receiver: CountingReceiver | None = None
        self._dummy: subprocess.Popen | None = None
        self._noise_spent = 0.0  # seconds spent waiting for quiet or repeating noisy windows
        self._run_no = 0

    # -- helpers ------------------------------------------------------------------

    def targets(self) -> list[str]:
        if self.args.target == "comm":
            return ["--comm", "nginx"]
        out = []
        for pid in self.nginx.all_pids():
            out += ["--pid", str(pid)]
        return out

    def tmp_json(self) -> Path:
        self._run_no += 1
        return self.workdir / f"spans-{self._run_no}.json"

    def meter(self, agent: AgentRun | None) -> CpuMeter:
        pids = {"nginx": self.nginx.all_pids()}
        if agent is not None:
            pids["agent"] = [agent.pid]
        if self.receiver is not None:
            pids["receiver"] = [self.receiver.proc.pid]
        return CpuMeter(pids)

    def quiet_cores(self, agent: AgentRun | None, seconds: float = 0.5) -> float:
        """CPU used by processes outside the benchmark over ``seconds`` (ours are idle between windows)."""
        meter = self.meter(agent)
        time.sleep(seconds)
        cpu = meter.stop()
        ours = sum(v for k, v in cpu.items() if k.endswith("_cores") and k != "busy_cores")
        return max(0.0, cpu["busy_cores"] - ours)

    def wait_for_quiet(self, agent: AgentRun | None) -> float:
        """Wait (up to --quiet-wait s) until other processes use < NOISY_CORES. Seconds waited."""
        t0 = time.monotonic()
        told = False
        limit = min(self.args.quiet_wait, self.noise_budget_left())
        while time.monotonic() - t0 < limit and self.quiet_cores(agent) > NOISY_CORES:
            if not told:
                say(f"  (the machine is busy with other work: waiting up to {limit:.0f}s for it to calm down)")
                told = True
        waited = time.monotonic() - t0
        self._noise_spent += waited if told else 0.0
        return round(waited, 1)

    def noise_budget_left(self) -> float:
        return max(0.0, self.args.noise_budget - self._noise_spent)

    def measure(self, load: Callable[[], WrkResult], trace: str | None, sink: str = "jsonfile", *, agent_cpus: str | None | bool = False,
                freeze: bool = False, probe: Any = None, agent_extra: list[str] | None = None, **labels: Any) -> dict[str, Any]:
        """One measured window, repeated (up to --noise-retries) while other processes disturbed it.

        ``trace``: None (no agent), "nginx" (the agent traces nginx) or "dummy" (the agent is
        attached but traces only an idle process: the cost of enabled tracepoints alone).
        ``agent_cpus``: the agent's pinning for this window (False: the layout's default).
        ``freeze``: SIGSTOP the agent once attached (user space reads nothing; the kernel
        fills the ring buffer, then drops every record). ``agent_extra``: more `otelbpf run`
        options for this window (mode drop: --discard-events). ``probe``: an object whose
        ``begin(agent)``/``end(agent, window)`` run around the load (bpf stats).
        """
        discarded = []
        for attempt in range(self.args.noise_retries + 1):
            window = self._measure_once(load, trace, sink, agent_cpus, freeze, probe, agent_extra or [])
            window.update(labels)
            noisy = window["cpu"]["other_cores"] > NOISY_CORES
            if not noisy or attempt == self.args.noise_retries or self.noise_budget_left() <= 0:
                break
            self._noise_spent += window["cpu"]["wall_s"]
            discarded.append({"rps": round(window["_rps"], 1), "other_cores": window["cpu"]["other_cores"]})
            say("  (discarded, other processes were busy) " + self.describe_window(window))
        if discarded:
            window["discarded_noisy_attempts"] = discarded
        window["noisy"] = window["cpu"]["other_cores"] > NOISY_CORES
        say("  " + self.describe_window(window))
        return window

    def _measure_once(self, load: Callable[[], WrkResult], trace: str | None, sink: str, agent_cpus: str | None | bool = False,
                      freeze: bool = False, probe: Any = None, agent_extra: list[str] = ()) -> dict[str, Any]:
        agent = None
        json_file = self.tmp_json()
        if trace is not None:
            if sink == "jsonfile":
                outputs = ["--json-file", str(json_file)]
            else:
                self.ensure_receiver().reset()
                outputs = ["--otlp-endpoint", self.receiver.grpc_endpoint, "--otlp-protocol", "grpc"]
            targets = self.targets() if trace == "nginx" else ["--pid", str(self.dummy_pid())]
            agent = self.agents.start(targets, [*outputs, *agent_extra], cpus=agent_cpus)
        try:
            time.sleep(0.3)
            waited = self.wait_for_quiet(agent)
            if freeze and agent is not None:
                os.kill(agent.pid, signal.SIGSTOP)
            before = self.nginx.status()
            meter = self.meter(agent)
            if probe is not None:
                probe.begin(agent)
            result = load()
            cpu = meter.stop()
            probe_out = probe.end(agent) if probe is not None else None
            cpu["wrk_cores"] = round(result.cpu_s / cpu["wall_s"], 3)
            ours = sum(v for k, v in cpu.items() if k.endswith("_cores") and k != "busy_cores")
            # CPU used by anything else on the machine (other sessions' jobs, kernel threads): noise
            cpu["other_cores"] = round(max(0.0, cpu["busy_cores"] - ours), 3)
            window: dict[str, Any] = {"wrk": result.as_dict(), "cpu": cpu, "waited_for_quiet_s": waited, "_rps": result.rps}
            if probe_out is not None:
                window["probe"] = probe_out
            if freeze and agent is not None:
                window["agent_frozen"] = True
                os.kill(agent.pid, signal.SIGCONT)
            if agent is not None:
                window["agent_caught_up_after_s"] = self.agents.wait_idle(agent)
                # the agent's CPU from the load's start until it has caught up with its backlog
                window["agent_cpu_s_to_caught_up"] = round(((proc_cpu_ticks(agent.pid) or 0) - meter.start["agent"]) / CLK_TCK, 2)
                window["agent_vmhwm_mb"] = round((proc_status_kb(agent.pid, "VmHWM") or 0) / 1024, 1)
                window["agent_vmrss_mb"] = round((proc_status_kb(agent.pid, "VmRSS") or 0) / 1024, 1)
            after = self.nginx.status()
            window["nginx_served"] = after["requests"] - before["requests"] - 1  # the 'after' read counts itself
        except BaseException:
            if agent is not None:
                self.children.stop(agent.proc, timeout=20)
            raise
        if agent is not None:
            stopped = self.agents.stop(agent)
            if trace == "nginx":
                spans = count_spans_in_json_file(json_file) if sink == "jsonfile" else self.receiver.counts()
                self.account(window, stopped, spans, sink)
            else:
                window.update(agent_stats=stopped["stats"], events_lost=stat(stopped["stats"], "otelbpf.events.lost"))
            window["agent_cpus"] = self.agents.cpus if agent_cpus is False else agent_cpus
            served = window["nginx_served"]
            if served > 0 and "agent_cpu_s_to_caught_up" in window:
                window["agent_us_per_request"] = round(1e6 * window["agent_cpu_s_to_caught_up"] / served, 2)
        if window["nginx_served"] > 0:
            window["nginx_us_per_request"] = round(1e6 * window["cpu"]["nginx_cpu_s"] / window["nginx_served"], 2)
        json_file.unlink(missing_ok=True)
        return window

    def outputs(self, sink: str) -> list[str]:
        if sink == "jsonfile":
            return ["--json-file", str(self.tmp_json())]
        return ["--otlp-endpoint", self.ensure_receiver().grpc_endpoint, "--otlp-protocol", "grpc"]

    def ensure_receiver(self) -> CountingReceiver:
        """The counting OTLP receiver (started once, on the client's CPUs, kept for the run)."""
        if self.receiver is None or self.receiver.proc.poll() is not None:
            self.receiver = CountingReceiver(self.children, self.layout.client)
        return self.receiver

    def dummy_pid(self) -> int:
        if self._dummy is None or self._dummy.poll() is not None:
            self._dummy = self.children.start("idle target", ["sleep", "1000000"], stdout=subprocess.DEVNULL)
        return self._dummy.pid

    def account(self, window: dict[str, Any], stopped: dict[str, Any], spans: dict[str, int], sink: str) -> dict[str, Any]:
        stats = stopped["stats"]
        served = window["nginx_served"]
        exported = spans["server_spans"]
        window.update(
            sink=sink,
            spans_exported=exported,
            spans_missing=served - exported,
            loss_pct=round(100.0 * (served - exported) / served, 3) if served else 0.0,
            agent_stats=stats,
            agent_stop_s=stopped["stop_s"],
            agent_warnings=stopped["warnings"],
            events_lost=stat(stats, "otelbpf.events.lost"),
            export_dropped=stat(stats, "otelbpf.export.dropped"),
            parse_errors=stat(stats, "otelbpf.parse.errors"),
            spans_created=stat(stats, "otelbpf.spans.created"),
            fast_path_exchanges=stat(stats, "otelbpf.fastpath.exchanges"),
            other_spans=spans["other_spans"],
        )
        window["loss_free"] = (
            served > 0 and exported == served and window["events_lost"] == 0 and window["export_dropped"] == 0
        )
        return window

    # -- parts -----------------------------------------------------------------------

    def start(self) -> None:
        self.nginx.start()
        self.wrk = Wrk(self.children, self.workdir, self.nginx.url, self.layout.client, self.args.paths)
        say(f"nginx {self.nginx.url} (master {self.nginx.master_pid}, workers {self.nginx.worker_pids()}); {self.layout.describe()}")
        say(f"warming up ({self.args.warmup}s at saturation) ...")
        if self.args.warmup:
            self.wrk.saturate(self.args.warmup, self.args.threads, self.args.connections)

    # mode -> (what the agent traces, where it runs, frozen?, description)
    MODES = {
        "off": (None, "none", False, "no agent"),
        "idle": ("dummy", "server", False, "agent attached on nginx's core, tracing only an idle process (the tax of attached probes)"),
        "on": ("nginx", "server", False, "agent tracing nginx, on nginx's core"),
        "own": ("nginx", "own", False, "agent tracing nginx, on its own core"),
        "kstop": ("nginx", "server", True, "agent tracing nginx but SIGSTOPped once attached: the kernel captures, user space reads nothing (ring buffer full, then every record dropped)"),
        "drop": ("nginx", "server", False, "agent tracing nginx with --discard-events, on nginx's core: the kernel captures every record, user space consumes it from the ring uncopied and undecoded"),
    }
    #: extra `otelbpf run` options per mode (an agent without them fails the window with its usage error)
    MODE_AGENT_ARGS = {"drop": ["--discard-events"]}

    def mode_cpus(self, mode: str) -> str | None | bool:
        where = self.MODES[mode][1]
        return self.layout.agent_own if where == "own" else False

    def run_mode(self, mode: str, load: Callable[[], WrkResult], **labels: Any) -> dict[str, Any]:
        trace, _where, freeze, _desc = self.MODES[mode]
        return self.measure(load, trace, self.args.sink, agent_cpus=self.mode_cpus(mode), freeze=freeze,
                            agent_extra=self.MODE_AGENT_ARGS.get(mode, []), mode=mode, **labels)  # fmt: skip

    @staticmethod
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

    def saturation(self) -> None:
        a = self.args
        modes = a.sat_modes
        say(f"\n[saturation] wrk -t{a.threads} -c{a.connections} (closed loop), {a.rounds} rounds x {len(modes)} modes x {a.duration}s, sink {a.sink}")
        for m in modes:
            say(f"  {m:<5} = {self.MODES[m][3]}")
        rows = []
        for rnd in range(1, a.rounds + 1):
            for mode in modes:
                rows.append(self.run_mode(mode, lambda: self.wrk.saturate(a.duration, a.threads, a.connections), round=rnd))
        per = self.per_mode(rows, modes)
        off = per["off"]["median_rps"]
        off_values = per["off"]["rps"]
        self.results["saturation"] = {
            "wrk": {"threads": a.threads, "connections": a.connections, "duration_s": a.duration, "paths": a.paths},
            "modes": {m: self.MODES[m][3] for m in modes},
            "sink": a.sink,
            "rounds": [strip_private(r) for r in rows],
            "per_mode": per,
            "median_rps": {m: per[m]["median_rps"] for m in modes},
            "ratio_to_off": {m: round(per[m]["median_rps"] / off, 3) for m in modes if m != "off" and off},
            "paired_ratio_to_off": {m: paired_ratio(rows, m) for m in modes if m != "off"},
            "off_spread_pct": round(100.0 * (max(off_values) - min(off_values)) / off, 1) if len(off_values) > 1 and off else None,
            "noisy_windows": sum(1 for r in rows if r["noisy"]),
        }
        s = self.results["saturation"]
        say("  => median req/s: " + ", ".join(f"{m} {fmt(per[m]['median_rps'])}" for m in modes) + "; ratios to off: " + ", ".join(f"{m} {v:.3f}x" for m, v in s["ratio_to_off"].items()))

    def fixed_rate(self) -> None:
        a = self.args
        rate = a.half_rate
        if rate is None:
            sat = self.results.get("saturation")
            if sat is None:
                say("\n(no saturation result to halve: measuring the off throughput once)")
                rate = self.wrk.saturate(a.duration, a.threads, a.connections).rps / 2
            else:
                rate = sat["median_rps"]["off"] / 2
        rate = int(round(rate, -2))
        modes = a.half_modes
        say(f"\n[half load] fixed {rate:,} req/s (half the untraced saturation): wrk -t1 -c{a.rate_connections}, open loop, {a.rounds} rounds x {len(modes)} modes x {a.duration}s, sink {a.sink}")
        rows = []
        for rnd in range(1, a.rounds + 1):
            for mode in modes:
                rows.append(self.run_mode(mode, lambda: self.wrk.fixed_rate(rate, a.duration, 1, a.rate_connections), round=rnd, target_rps=rate))

        def med(mode: str, key: str) -> float | None:
            return median([r["wrk"]["latency_us"][key] for r in rows if r["mode"] == mode])

        per = self.per_mode(rows, modes)
        traced = [m for m in modes if m != "off"]
        self.results["fixed_rate"] = {
            "target_rps": rate,
            "connections": a.rate_connections,
            "sink": a.sink,
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
        f = self.results["fixed_rate"]
        for m in traced:
            say(f"  => {m}: p99 off {fmt(med('off', 'p99'))} us, {m} {fmt(med(m, 'p99'))} us: added p99 {fmt(f['added_p99_us'][m], '+,.0f')} us (x{f['p99_ratio'][m]}); spans/requests {fmt(per[m].get('spans_per_request'), '.4f')}")
        if f["late_pct_max"] > 1:
            say(f"  !! the generator fell behind its schedule ({f['late_pct_max']}% of requests late): nginx did not keep up, the rate was not held and the latencies above are under-reported (coordinated omission)")

    def cost(self) -> None:
        """Agent CPU per request at a fixed rate (10k), alternated with no agent: user space and kernel tax apart."""
        a = self.args
        rate = a.cost_rate
        modes = a.cost_modes
        say(f"\n[cost] fixed {rate:,} req/s, {a.rounds} rounds x {len(modes)} modes x {a.duration}s, sink {a.sink}: agent CPU (utime+stime, load start -> caught up) per request; nginx CPU per request (its syscalls carry the probes)")
        rows = []
        for rnd in range(1, a.rounds + 1):
            for mode in modes:
                rows.append(self.run_mode(mode, lambda: self.wrk.fixed_rate(rate, a.duration, 1, a.rate_connections), round=rnd, target_rps=rate))
        per = self.per_mode(rows, modes)
        off_ng = per["off"]["median_nginx_us_per_request"] if "off" in per else None
        out: dict[str, Any] = {"target_rps": rate, "sink": a.sink, "rounds": [strip_private(r) for r in rows], "per_mode": per}
        say("  => " + "; ".join(
            f"{m}: {fmt(per[m]['median_rps'])} req/s, nginx {fmt(per[m]['median_nginx_us_per_request'], '.1f')} us/req"
            + (f", agent {fmt(per[m].get('median_agent_us_per_request'), '.1f')} us/req ({fmt(per[m].get('median_agent_cores'), '.2f')} cores), spans/requests {fmt(per[m].get('spans_per_request'), '.4f')}, events lost {per[m].get('events_lost', 0):,}" if m != "off" else "")
            for m in modes))
        if off_ng is not None:
            out["kernel_tax_us_per_request"] = {m: round(per[m]["median_nginx_us_per_request"] - off_ng, 2) for m in modes if m != "off" and per[m]["median_nginx_us_per_request"] is not None}
            say("  => kernel tax seen from nginx (its CPU per request, traced minus untraced): " + ", ".join(f"{m} {v:+.1f} us" for m, v in out["kernel_tax_us_per_request"].items()))
        self.results["cost"] = out

    def bpf(self) -> None:
        """BPF program run time per program (kernel.bpf_stats_enabled), at the cost rate."""
        import bpf_stats

        a = self.args
        rate = a.cost_rate
        say(f"\n[bpf] BPF run time per program at {rate:,} req/s, {a.duration}s per mode (kernel.bpf_stats_enabled=1 for these windows only; timing adds ~2 clock reads per run)")
        previous = bpf_stats.set_stats(True)
        out: dict[str, Any] = {"target_rps": rate}
        try:
            for mode in ("idle", "on"):
                probe = BpfProbe(bpf_stats)
                trace, _where, freeze, _desc = self.MODES[mode]
                w = self.measure(lambda: self.wrk.fixed_rate(rate, a.duration, 1, a.rate_connections), trace, a.sink, agent_cpus=self.mode_cpus(mode), probe=probe, mode=mode, target_rps=rate)
                res = bpf_stats.delta(probe.before, w["probe"]["after"], w["nginx_served"]) if w.get("probe") else None
                if res is None:
                    continue
                res["wall_s"] = w["cpu"]["wall_s"]
                res["nginx_cpu_s"] = w["cpu"]["nginx_cpu_s"]
                res["bpf_share_of_nginx_cpu"] = round(res["total_ns"] / 1e9 / w["cpu"]["nginx_cpu_s"], 3) if w["cpu"]["nginx_cpu_s"] else None
                w.pop("probe", None)
                out[mode] = {"window": strip_private(w), **res}
                say(f"  mode {mode} ({self.MODES[mode][3]}): {res['total_ns'] / 1e6:,.1f} ms of BPF in {res['wall_s']:.1f}s = {fmt(res.get('total_ns_per_request'), ',.0f')} ns per request served, {fmt(res['bpf_share_of_nginx_cpu'], '.1%')} of nginx's CPU (BPF also runs in other processes' syscalls)")
                say(bpf_stats.format_table(res))
        finally:
            bpf_stats.set_stats(previous)
        try:  # the timing's own cost per run, to read the programs' work apart from it
            floor = bpf_stats.measure_floor()
        except Exception as exc:  # noqa: BLE001 - a measurement aid; the table above stands without it
            say(f"  (timing floor not measured: {exc})")
        else:
            out["floor_ns_per_run"] = floor["ns_per_run"]
            for mode in ("idle", "on"):
                res = out.get(mode)
                if res and res.get("total_runs_per_request") is not None and floor["ns_per_run"]:
                    above = res["total_ns_per_request"] - floor["ns_per_run"] * res["total_runs_per_request"]
                    res["ns_per_request_above_floor"] = round(max(0.0, above), 1)
                    say(f"  mode {mode}: {above:,.0f} ns per request above the timing floor ({floor['ns_per_run']} ns per run: an empty program on sock_send_length, dispatch + two clock reads)")
        self.results["bpf"] = out

    def loss_sweep(self) -> None:
        a = self.args
        say(f"\n[loss] span loss at fixed rates {', '.join(f'{r:,}' for r in a.rates)} req/s, {a.loss_duration}s each; configurations: {', '.join(a.sweeps)}")
        sweep: dict[str, Any] = {}
        for config in a.sweeps:
            sink, where = config.split("@")
            cpus = self.layout.agent_own if where == "own" else False
            say(f"  -- {config}: sink {sink}, agent on " + ("its own core" if where == "own" else "nginx's core") + f" (CPU {self.layout.agent_own if where == 'own' else self.layout.agent})")
            runs: list[dict] = []
            lossy_seen = 0
            for rate in a.rates:
                if lossy_seen >= 2 and not a.sweep_all:
                    say(f"  (skipping {rate:,} and above: two lower rates lost spans; --sweep-all runs them)")
                    break
                run = self.measure(lambda: self.wrk.fixed_rate(rate, a.loss_duration, 1, a.rate_connections), "nginx", sink, agent_cpus=cpus, target_rps=rate, mode="on", config=config)
                runs.append(run)
                lossy_seen += 0 if run["loss_free"] else 1
            for _ in range(a.refine):
                passed = [r["target_rps"] for r in runs if r["loss_free"]]
                failed = [r["target_rps"] for r in runs if not r["loss_free"]]
                lo = max(passed, default=0)
                hi = min((f for f in failed if f > lo), default=None)
                if hi is None or hi - lo <= 500:
                    break
                mid = int(round((lo + hi) / 2, -2))
                say(f"  (refining between {lo:,} and {hi:,})")
                runs.append(self.measure(lambda: self.wrk.fixed_rate(mid, a.loss_duration, 1, a.rate_connections), "nginx", sink, agent_cpus=cpus, target_rps=mid, mode="on", config=config))
            runs.sort(key=lambda r: r["target_rps"])
            passed = [r["target_rps"] for r in runs if r["loss_free"]]
            failed = [r["target_rps"] for r in runs if not r["loss_free"]]
            highest = max(passed, default=None)
            sweep[config] = {
                "sink": sink,
                "agent": where,
                "runs": [strip_private(r) for r in runs],
                "highest_loss_free_rps": highest,
                "lowest_lossy_rps": min(failed, default=None),
                "monotonic": not failed or highest is None or highest < min(failed),
            }
            say(f"  => {config}: highest loss-free rate {fmt(highest)} req/s" + ("" if sweep[config]["monotonic"] else " (a lower rate lost spans: noisy or unstable, see the runs)"))
        self.results["loss_sweep"] = sweep

    def agent_cost(self) -> None:
        sweep = self.results.get("loss_sweep")
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
        self.results["agent_cost"] = out

    def startup(self) -> None:
        a = self.args
        say(f"\n[startup] {a.starts} starts of the agent tracing nginx (idle), sink {a.sink}: from exec to its '{TRACING_PREFIX}' line")
        runs = []
        idle_cores = None
        for n in range(a.starts):
            agent = self.agents.start(self.targets(), self.outputs(self.args.sink))
            extra = ""
            if n == 0:  # what the agent costs with nothing to trace (its drain loop)
                time.sleep(0.5)
                meter = self.meter(agent)
                time.sleep(3.0)
                idle_cores = meter.stop()["agent_cores"]
                extra = f"; idle, it uses {idle_cores:.3f} cores"
            hwm = proc_status_kb(agent.pid, "VmHWM")
            stopped = self.agents.stop(agent)
            runs.append({"to_tracing_s": round(agent.attached_after_s, 2), "self_reported_s": agent.self_reported_s, "stop_s": stopped["stop_s"], "vmhwm_mb": round((hwm or 0) / 1024, 1)})
            say(f"  tracing after {agent.attached_after_s:.2f}s (agent says {agent.self_reported_s}s to compile+attach); stop took {stopped['stop_s']:.2f}s{extra}")
        self.results["startup"] = {
            "idle_agent_cores": idle_cores,
            "runs": runs,
            "median_to_tracing_s": round(median([r["to_tracing_s"] for r in runs]), 2),
            "median_self_reported_s": median([r["self_reported_s"] for r in runs if r["self_reported_s"] is not None]),
            "median_stop_s": round(median([r["stop_s"] for r in runs]), 2),
            "median_idle_vmhwm_mb": median([r["vmhwm_mb"] for r in runs]),
        }

    # -- reporting ---------------------------------------------------------------------

    @staticmethod
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

    def headline(self) -> dict[str, dict[str, Any]]:
        """The figures the issue asks for, flat: key -> {label, value, unit, better}. compare.py diffs these."""
        r = self.results
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
        hwm = [w.get("agent_vmhwm_mb") for w in self.all_windows() if w.get("agent_vmhwm_mb")]
        put("rss.peak_mb", "agent peak RSS (VmHWM), max over every window", max(hwm) if hwm else None, "MB", "lower")
        if cost and cost["per_mode"].get("on", {}).get("max_agent_vmhwm_mb"):
            put("rss.peak_mb.cost_on", f"agent peak RSS at {cost['target_rps']:,}/s, on", cost["per_mode"]["on"]["max_agent_vmhwm_mb"], "MB", "lower")
        st = r.get("startup")
        if st:
            put("startup.to_tracing_s", "start-up: exec -> 'otelbpf: tracing'", st["median_to_tracing_s"], "s", "lower")
            put("startup.self_reported_s", "start-up: the agent's own figure", st["median_self_reported_s"], "s", "lower")
            put("startup.idle_vmhwm_mb", "agent RSS (VmHWM) idle", st["median_idle_vmhwm_mb"], "MB", "lower")
        return h

    def all_windows(self):
        r = self.results
        for part in ("saturation", "fixed_rate", "cost"):
            yield from (r.get(part) or {}).get("rounds", [])
        for data in (r.get("loss_sweep") or {}).values():
            yield from data["runs"]

    def summary(self) -> list[dict[str, Any]]:
        """The issue's targets, for reference (nothing here fails: numbers, not asserts)."""
        h = self.results.get("headline") or self.headline()
        targets = []

        def add(target: str, key: str, ok: Callable[[Any], bool], show: Callable[[Any], str]) -> None:
            if key in h:
                v = h[key]["value"]
                targets.append({"target": target, "key": key, "value": show(v), "met": bool(ok(v))})

        add("probes attached, nothing traced >= 0.99x of untraced nginx (saturation idle/off)", "sat.ratio.idle", lambda v: v >= 0.99, lambda v: f"{v:.3f}x")
        add("traced, user space dropping everything >= 0.95x (drop/off: the agent reads every record and drops it, --discard-events)", "sat.ratio.drop", lambda v: v >= 0.95, lambda v: f"{v:.3f}x")
        add("traced, user space stopped (kstop/off: the kernel drops once the ring is full; a lower bound of the capture's cost)", "sat.ratio.kstop", lambda v: v >= 0.95, lambda v: f"{v:.3f}x")
        sink = self.args.sink
        add(f"<= 10 us agent CPU per request at {self.args.cost_rate:,}/s, agent on nginx's core (sink {sink}; the issue means OTLP on)", "cost.agent_us_per_request.on", lambda v: v <= 10, lambda v: f"{v:.1f} us")
        if "cost.spans_per_request.on" in h:
            e = self.results["cost"]["per_mode"]["on"]
            targets.append({"target": f"zero span loss at {self.args.cost_rate:,}/s, agent on nginx's core (cost windows)", "key": "cost.spans_per_request.on",
                            "value": f"{e['spans']:,}/{e['served']:,} spans, events lost {e['events_lost']:,}, {e['loss_free_windows']}/{e['windows']} windows loss-free",
                            "met": e["loss_free_windows"] == e["windows"]})
        for config, data in (self.results.get("loss_sweep") or {}).items():
            for rate, where in ((10000, "server"), (50000, "own")):
                if data["agent"] != where:
                    continue
                run = next((x for x in data["runs"] if x["target_rps"] == rate), None)
                value = f"highest loss-free {fmt(data['highest_loss_free_rps'])} req/s" + (f"; at {rate:,}: {run['spans_exported']:,}/{run['nginx_served']:,} spans, events lost {run['events_lost']:,}" if run else f"; {rate:,} not run")
                targets.append({"target": f"zero span loss at {rate:,}/s ({config})", "key": f"loss.highest_loss_free_rps.{config}", "value": value, "met": bool(run and run["loss_free"])})
        return targets

    def print_summary(self) -> None:
        r = self.results
        say("\n" + "=" * 100)
        say("SUMMARY  (" + r["machine"]["summary"] + ")")
        au = r.get("agent_under_test", {})
        say(f"agent under test: {' '.join(au.get('argv', []))} in {au.get('cwd')} (commit {au.get('commit', '')[:12]}, {au.get('modified_files')} modified files)   label: {r.get('label')}")
        say(f"layout: {self.layout.describe()}")
        sat = r.get("saturation")
        if sat:
            say(f"\nsaturation (wrk closed loop; median of {self.args.rounds} alternated rounds; sink {sat['sink']}):")
            rows = []
            for m, e in sat["per_mode"].items():
                rows.append([m, fmt(e["median_rps"]), "1" if m == "off" else f"{sat['ratio_to_off'][m]:.3f}", "" if m == "off" else fmt(sat["paired_ratio_to_off"].get(m), ".3f"),
                             fmt(e["median_nginx_cores"], ".2f"), fmt(e.get("median_agent_cores"), ".2f"), "/".join(f"{v:.0%}" for k, v in e["median_cpu_busy"].items() if k != "cpu"),
                             fmt(e.get("spans_per_request"), ".4f"), fmt(e.get("events_lost"), ","), fmt(e["median_p99_us"]), " ".join(fmt(v) for v in e["rps"])])
            say(table(["mode", "req/s", "x off", "paired", "nginx cores", "agent cores", "cpu busy", "spans/req", "ev lost", "p99 us", "raw req/s per round"], rows))
            say(f"  off rounds spread {fmt(sat['off_spread_pct'], '.1f')}%; noisy windows kept: {sat['noisy_windows']} of {len(sat['rounds'])}")
        fr = r.get("fixed_rate")
        if fr:
            say(f"\nhalf load: fixed {fr['target_rps']:,} req/s (open loop, sink {fr['sink']}):")
            rows = []
            for m, e in fr["per_mode"].items():
                lat = fr["median_latency_us"][m]
                rows.append([m, fmt(e["median_rps"]), fmt(lat["p50"]), fmt(lat["p99"]), "" if m == "off" else fmt(fr["added_p99_us"][m], "+,.0f"), fmt(fr["late_pct_median"][m], ".2f"), fmt(e.get("spans_per_request"), ".4f"), fmt(e.get("median_agent_cores"), ".2f")])
            say(table(["mode", "req/s", "p50 us", "p99 us", "added p99 us", "late %", "spans/req", "agent cores"], rows))
            if fr["late_pct_max"] > 1:
                say("  (rate not held in some window: latency under-reported)")
        cost = r.get("cost")
        if cost:
            say(f"\nagent cost at {cost['target_rps']:,} req/s (sink {cost['sink']}; median of alternated rounds):")
            rows = []
            tax = cost.get("kernel_tax_us_per_request") or {}
            for m, e in cost["per_mode"].items():
                rows.append([m, fmt(e["median_rps"]), fmt(e.get("median_agent_us_per_request"), ".1f"), fmt(e.get("median_agent_cores"), ".2f"), fmt(e["median_nginx_us_per_request"], ".1f"), fmt(tax.get(m), "+.1f"),
                             fmt(e.get("spans_per_request"), ".4f"), fmt(e.get("fast_path_share"), ".3f"), fmt(e.get("events_lost"), ","), fmt(e.get("max_agent_vmhwm_mb"), ".0f")])
            say(table(["mode", "req/s", "agent us/req", "agent cores", "nginx us/req", "kernel tax us/req", "spans/req", "fast share", "ev lost", "VmHWM MB"], rows))
        b = r.get("bpf")
        if b:
            say(f"\nBPF programs at {b['target_rps']:,} req/s (kernel.bpf_stats_enabled):")
            for m in ("idle", "on"):
                if m in b:
                    say(f"  {m}: {fmt(b[m].get('total_ns_per_request'), ',.0f')} ns of BPF per request ({fmt(b[m].get('total_runs_per_request'), '.1f')} runs); top: " + ", ".join(f"{p['name']} {fmt(p.get('ns_per_request'), ',.0f')} ns/req ({fmt(p['ns_per_run'], ',.0f')} ns/run)" for p in b[m]["programs"][:4]))
        for config, data in (r.get("loss_sweep") or {}).items():
            rows = [[f"{x['target_rps']:,}", fmt(x["wrk"]["rps"]), f"{x['nginx_served']:,}", f"{x['spans_exported']:,}", f"{x['loss_pct']:.2f}%", f"{x['events_lost']:,}", f"{x['export_dropped']:,}", fmt(x["cpu"].get("agent_cores"), ".2f"), fmt(x.get("agent_us_per_request"), ".1f"), fmt(x["cpu"].get("nginx_cores"), ".2f"), fmt(x.get("agent_vmhwm_mb"), ".0f"), "yes" if x["loss_free"] else "NO", f"{x['cpu']['other_cores']:.2f}" + (" !" if x["noisy"] else "")] for x in data["runs"]]
            say(f"\nspan loss, {config}: highest loss-free rate {fmt(data['highest_loss_free_rps'])} req/s")
            say(table(["target/s", "achieved/s", "served", "spans", "loss", "ev lost", "dropped", "agent cores", "agent us/req", "nginx cores", "HWM MB", "loss-free", "noise cores"], rows))
        st = r.get("startup")
        if st:
            say(f"\nstart-up to tracing: median {st['median_to_tracing_s']}s (agent's own compile+attach {st['median_self_reported_s']}s); stop {st['median_stop_s']}s; idle VmHWM {st['median_idle_vmhwm_mb']} MB, idle CPU {fmt(st['idle_agent_cores'], '.3f')} cores")
        say("\nheadline (compare two reports with bench/compare.py BEFORE.json AFTER.json):")
        say(table(["figure", "value", "unit"], [[v["label"], fmt(v["value"], ",.3f" if isinstance(v["value"], float) and abs(v["value"]) < 10 else ",.0f" if isinstance(v["value"], (int, float)) else ""), v["unit"]] for v in r.get("headline", {}).values()]))
        say("\nthe issue's targets (reference only, nothing is asserted):")
        for t in r.get("targets", []):
            say(f"  [{'MET' if t['met'] else 'NOT MET'}] {t['target']}: {t['value']}")


def paired_ratio(rows: list[dict[str, Any]], mode: str) -> float | None:
    """Median over rounds of (mode's req/s / off's req/s in the same round): a second estimator, robust to drift."""
    ratios = []
    for rnd in sorted({r["round"] for r in rows}):
        off = [r["_rps"] for r in rows if r["round"] == rnd and r["mode"] == "off"]
        other = [r["_rps"] for r in rows if r["round"] == rnd and r["mode"] == mode]
        if off and other and off[0]:
            ratios.append(other[0] / off[0])
    return round(statistics.median(ratios), 3) if ratios else None


def strip_private(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not k.startswith("_")}


#: Defaults of a full run, and of --quick (~1 min); an explicit flag wins over both.
FULL = {"duration": 6, "rounds": 5, "rates": "2000,5000,10000,20000,30000,50000", "loss_duration": 10, "refine": 2, "starts": 5, "warmup": 2}
QUICK = {"duration": 3, "rounds": 1, "rates": "10000", "loss_duration": 3, "refine": 0, "starts": 1, "warmup": 1}
PARTS = ("saturation", "fixed", "cost", "bpf", "loss", "startup")
SINKS = ("otlp-grpc", "jsonfile")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="nginx under wrk, traced by otelbpf vs not (see bench/README.md).")
    f, q = FULL, QUICK
    p.add_argument("--quick", action="store_true", help="short smoke run, about a minute (defaults in [] below)")
    p.add_argument("--duration", type=int, help=f"seconds per saturation / half-load window, whole seconds (default {f['duration']} [{q['duration']}])")
    p.add_argument("--rounds", type=int, help=f"alternated rounds of the modes at saturation, at half load and at the cost rate (default {f['rounds']} [{q['rounds']}])")
    p.add_argument("--rates", help=f"fixed rates (req/s) of the span-loss sweep, 10000 always added (default {f['rates']} [{q['rates']}])")
    p.add_argument("--sink", choices=SINKS, default="otlp-grpc", help="where the agent sends spans in saturation, half load, cost, bpf and start-up: OTLP/gRPC to bench/otlp_counting_receiver.py, or a JSON file (default otlp-grpc)")
    p.add_argument("--sat-modes", default="off,idle,on,own,kstop,drop", help="modes at saturation (default off,idle,on,own,kstop,drop; see bench/README.md; drop needs an agent with --discard-events)")
    p.add_argument("--half-modes", default="off,on", help="modes at half load (default off,on)")
    p.add_argument("--cost-rate", type=int, default=10000, help="fixed rate of the cost and bpf parts (default 10000)")
    p.add_argument("--cost-modes", default="off,on,own", help="modes at the cost rate (default off,on,own)")
    p.add_argument("--sweeps", default="otlp-grpc@server,otlp-grpc@own", help="span-loss sweeps, SINK@server (agent on nginx's core) or SINK@own (its own core) (default otlp-grpc@server,otlp-grpc@own)")
    p.add_argument("--sweep-all", action="store_true", help="run every rate of a sweep (default: stop after two lossy rates)")
    p.add_argument("--repo", help="run the agent from this checkout (its .venv/bin/python if it has one): for before -> after, e.g. a `git worktree` of the base commit")
    p.add_argument("--agent-python", help="interpreter for `-m otelbpf` (default: --repo's .venv, else this one)")
    p.add_argument("--otelbpf-cmd", help="the agent's command prefix, instead of `PYTHON -m otelbpf` (e.g. /opt/other/.venv/bin/otelbpf); 'run ...' is appended")
    p.add_argument("--label", help="a name for this run in the report (e.g. before, after; default: the agent checkout's short commit)")
    p.add_argument("--loss-duration", type=int, help=f"seconds per rate of the span-loss sweep (default {f['loss_duration']} [{q['loss_duration']}])")
    p.add_argument("--refine", type=int, help=f"extra sweep runs bisecting between the highest loss-free and the lowest lossy rate (default {f['refine']} [{q['refine']}])")
    p.add_argument("--starts", type=int, help=f"agent starts for the start-up time (default {f['starts']} [{q['starts']}])")
    p.add_argument("--warmup", type=int, help=f"seconds of unmeasured load after nginx starts (default {f['warmup']} [{q['warmup']}])")
    p.add_argument("--half-rate", type=float, help="fixed rate of the half-load part (default: half the median saturated throughput with the agent off)")
    p.add_argument("--only", default=",".join(PARTS), help=f"parts to run, comma-separated, of {','.join(PARTS)} (default: all)")
    p.add_argument("--quiet-wait", type=float, default=30.0, help="before each window, wait up to this long for other processes to use < 0.15 cores (default 30)")
    p.add_argument("--noise-retries", type=int, default=2, help="repeat a window this many times while other processes used >= 0.15 cores during it (default 2)")
    p.add_argument("--noise-budget", type=float, default=180.0, help="total seconds the run may spend on those waits and repeats (default 180)")
    p.add_argument("--threads", type=int, default=1, help="wrk threads at saturation (default 1)")
    p.add_argument("--connections", type=int, default=50, help="wrk connections at saturation (default 50)")
    p.add_argument("--rate-connections", type=int, default=300, help="wrk connections at fixed rates, enough that one is free at every slot (default 300)")
    p.add_argument("--workers", type=int, default=1, help="nginx worker_processes (default 1)")
    p.add_argument("--sendfile", action="store_true", help="nginx 'sendfile on' (default off, so the 4 KB body goes through writev and is captured)")
    p.add_argument("--paths", default=",".join(DEFAULT_PATHS), help=f"request paths wrk cycles through (default {','.join(DEFAULT_PATHS)})")
    p.add_argument("--target", choices=("pid", "comm"), default="pid", help="trace nginx by --pid (master and workers) or by --comm nginx (default pid)")
    p.add_argument("--server-cpus", help="CPUs for nginx (default: the first available)")
    p.add_argument("--client-cpus", help="CPUs for wrk and the OTLP receiver (default: the others)")
    p.add_argument("--agent-cpus", default="server", help="CPUs for the agent 'on nginx's core': server, client, any, or a list (default server)")
    p.add_argument("--agent-own-cpus", help="CPUs for the agent 'on its own core' (modes own, sweeps @own) (default: the client's CPUs, shared with wrk on a 2-CPU machine)")
    p.add_argument("--no-pin", action="store_true", help="pin nothing")
    p.add_argument("--agent-arg", action="append", default=[], help="extra argument for `otelbpf run` (repeatable), e.g. --agent-arg=--capture-bytes=512")
    p.add_argument("--output", type=Path, help="JSON report path (default bench/results/nginx_wrk-<UTC time>.json)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    try:
        rates = sorted({int(float(r)) for r in str(args.rates).split(",") if r.strip()} | {10000})
    except ValueError:
        parser.error(f"--rates {args.rates!r}: give numbers separated by commas")
    if any(r <= 0 for r in rates):
        parser.error("--rates must be positive")
    args.rates = rates
    args.paths = [p.strip() for p in str(args.paths).split(",") if p.strip()]
    if not args.paths or any(not p.startswith("/") for p in args.paths):
        parser.error("--paths: give absolute paths, e.g. /,/static/4k.txt")
    args.only = {{"half": "fixed"}.get(p.strip(), p.strip()) for p in args.only.split(",") if p.strip()}
    unknown = args.only - set(PARTS)
    if unknown:
        parser.error(f"--only: unknown part(s) {sorted(unknown)}")
    for name in ("sat_modes", "half_modes", "cost_modes"):
        modes = [m.strip() for m in getattr(args, name).split(",") if m.strip()]
        bad = [m for m in modes if m not in Bench.MODES]
        if bad or "off" not in modes:
            parser.error(f"--{name.replace('_', '-')}: modes among {', '.join(Bench.MODES)}, 'off' included (got {getattr(args, name)!r})")
        setattr(args, name, ["off", *[m for m in modes if m != "off"]])
    args.sweeps = [c.strip() for c in args.sweeps.split(",") if c.strip()]
    for c in args.sweeps:
        sink, _, where = c.partition("@")
        if sink not in SINKS or where not in ("server", "own"):
            parser.error(f"--sweeps: {c!r} is not SINK@server or SINK@own with SINK in {SINKS}")
    if args.repo and not (Path(args.repo) / "otelbpf").is_dir() and not args.otelbpf_cmd:
        parser.error(f"--repo {args.repo}: no otelbpf/ package there")
    for name in ("duration", "rounds", "loss_duration", "threads", "connections", "rate_connections", "workers", "cost_rate"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if min(args.starts, args.refine, args.warmup, args.noise_retries, args.quiet_wait, args.noise_budget) < 0:
        parser.error("--starts, --refine, --warmup, --noise-retries, --quiet-wait and --noise-budget must be >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = dt.datetime.now(dt.timezone.utc)
    children = Children()

    def on_term(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored (a background job)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    workdir = Path(tempfile.mkdtemp(prefix="otelbpf-bench-nginx-"))
    bench = None
    code = 0
    try:
        preflight(args)
        busy = system_busy_check()
        bench = Bench(args, children, workdir)
        bench.results["machine"] = machine_info()
        bench.results["started"] = started.isoformat(timespec="seconds")
        bench.results["command"] = [sys.executable, *sys.argv] if argv is None else ["nginx_wrk.py", *argv]
        bench.results["config"] = {k: (sorted(v) if isinstance(v, set) else str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        bench.results["layout"] = {"server": bench.layout.server, "client": bench.layout.client, "agent": bench.layout.agent, "agent_own": bench.layout.agent_own, "description": bench.layout.describe()}
        bench.results["agent_under_test"] = bench.agent_command.describe()
        bench.results["label"] = args.label or (bench.results["agent_under_test"].get("commit") or "")[:12] or "unlabelled"
        bench.results["idle_before_start"] = busy
        say(f"otelbpf nginx/wrk benchmark -- {bench.results['machine']['summary']}")
        au = bench.results["agent_under_test"]
        say(f"agent under test [{bench.results['label']}]: {' '.join(au['argv'])} run ... (in {au['cwd']}, commit {au['commit'][:12]} {au['commit_subject'][:60]!r}, {au['modified_files']} modified files)")
        if busy > 0.10:
            say(f"WARNING: the machine was {busy:.0%} busy before the benchmark started: other work skews the numbers (alternation limits, does not remove, the effect)")
        bench.start()
        if "saturation" in args.only:
            bench.saturation()
        if "fixed" in args.only:
            bench.fixed_rate()
        if "cost" in args.only:
            bench.cost()
        if "bpf" in args.only:
            bench.bpf()
        if "loss" in args.only:
            bench.loss_sweep()
            bench.agent_cost()
        if "startup" in args.only:
            bench.startup()
        bench.results["headline"] = bench.headline()
        bench.results["targets"] = bench.summary()
        bench.results["noise"] = {"threshold_cores": NOISY_CORES, "seconds_spent": round(bench._noise_spent, 1)}
    except KeyboardInterrupt:
        say("\ninterrupted: stopping nginx, wrk and the agent ...")
        code = 130
    except BenchError as exc:
        say(f"\nnginx_wrk: error: {exc}")
        code = 2
    finally:
        children.stop_all()
        if bench is not None:
            bench.nginx.proc = None
        shutil.rmtree(workdir, ignore_errors=True)
    if bench is not None and code == 0:
        bench.results["finished"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        bench.results["elapsed_s"] = round((dt.datetime.now(dt.timezone.utc) - started).total_seconds(), 1)
        bench.print_summary()
        path = args.output or RESULTS_DIR / f"nginx_wrk-{started.strftime('%Y%m%d-%H%M%S')}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(bench.results, indent=2) + "\n")
        say(f"\nreport written to {path} ({bench.results['elapsed_s']:.0f}s)")
    return code


if __name__ == "__main__":
    sys.exit(main())
