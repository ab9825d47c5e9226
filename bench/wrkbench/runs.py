"""The bench's runs: measured windows of nginx under wrk, per mode, per sweep and per loss rate.

A window is one load (closed loop or a fixed rate) with the agent in one mode, measured from
outside: wrk's figures, the CPU of every process, nginx's own request count and the spans that
arrived. Modes are alternated round by round so the machine's drift hits every mode alike, and a
window that other processes disturbed is repeated. Turning the windows into figures and tables is
report.py's business; this module only drives the workload and records what it saw.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from . import report
from .agent import TRACING_PREFIX, AgentCommand, AgentLauncher, AgentRun, stat
from .console import say
from .nginx import Nginx
from .pinning import choose_layout
from .processes import Children, free_port
from .procfs import CLK_TCK, NOISY_CORES, CpuMeter, proc_cpu_ticks, proc_status_kb
from .span_counting import CountingReceiver, count_spans_in_json_file
from .wrk import Wrk, WrkResult

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


class BpfProbe:
    """Snapshots of the agent's BPF program counters around a window's load (see bpf_stats.py)."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.before: dict = {}

    def begin(self, agent: Any) -> None:
        self.before = self.module.snapshot(agent.pid) if agent is not None else {}

    def end(self, agent: Any) -> dict:
        return {"after": self.module.snapshot(agent.pid) if agent is not None else {}}


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
        self.noise_spent = 0.0  # seconds spent waiting for quiet or repeating noisy windows
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
        self.noise_spent += waited if told else 0.0
        return round(waited, 1)

    def noise_budget_left(self) -> float:
        return max(0.0, self.args.noise_budget - self.noise_spent)

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
            self.noise_spent += window["cpu"]["wall_s"]
            discarded.append({"rps": round(window["_rps"], 1), "other_cores": window["cpu"]["other_cores"]})
            say("  (discarded, other processes were busy) " + report.describe_window(window))
        if discarded:
            window["discarded_noisy_attempts"] = discarded
        window["noisy"] = window["cpu"]["other_cores"] > NOISY_CORES
        say("  " + report.describe_window(window))
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

    def mode_cpus(self, mode: str) -> str | None | bool:
        where = MODES[mode][1]
        return self.layout.agent_own if where == "own" else False

    def run_mode(self, mode: str, load: Callable[[], WrkResult], **labels: Any) -> dict[str, Any]:
        trace, _where, freeze, _desc = MODES[mode]
        return self.measure(load, trace, self.args.sink, agent_cpus=self.mode_cpus(mode), freeze=freeze,
                            agent_extra=MODE_AGENT_ARGS.get(mode, []), mode=mode, **labels)  # fmt: skip

    def alternate(self, modes: list[str], load: Callable[[], WrkResult], **labels: Any) -> list[dict[str, Any]]:
        """--rounds rounds of every mode in turn under ``load``: one window each."""
        rows = []
        for rnd in range(1, self.args.rounds + 1):
            for mode in modes:
                rows.append(self.run_mode(mode, load, round=rnd, **labels))
        return rows

    def saturation(self) -> None:
        a = self.args
        modes = a.sat_modes
        say(f"\n[saturation] wrk -t{a.threads} -c{a.connections} (closed loop), {a.rounds} rounds x {len(modes)} modes x {a.duration}s, sink {a.sink}")
        for m in modes:
            say(f"  {m:<5} = {MODES[m][3]}")
        rows = self.alternate(modes, lambda: self.wrk.saturate(a.duration, a.threads, a.connections))
        self.results["saturation"] = report.saturation_result(rows, a, {m: MODES[m][3] for m in modes})
        report.say_saturation(self.results["saturation"])

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
        rows = self.alternate(modes, lambda: self.wrk.fixed_rate(rate, a.duration, 1, a.rate_connections), target_rps=rate)
        self.results["fixed_rate"] = report.fixed_rate_result(rows, a, rate)
        report.say_fixed_rate(self.results["fixed_rate"])

    def cost(self) -> None:
        """Agent CPU per request at a fixed rate (10k), alternated with no agent: user space and kernel tax apart."""
        a = self.args
        rate = a.cost_rate
        modes = a.cost_modes
        say(f"\n[cost] fixed {rate:,} req/s, {a.rounds} rounds x {len(modes)} modes x {a.duration}s, sink {a.sink}: agent CPU (utime+stime, load start -> caught up) per request; nginx CPU per request (its syscalls carry the probes)")
        rows = self.alternate(modes, lambda: self.wrk.fixed_rate(rate, a.duration, 1, a.rate_connections), target_rps=rate)
        self.results["cost"] = report.cost_result(rows, a)
        report.say_cost(self.results["cost"])

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
                trace, _where, freeze, _desc = MODES[mode]
                w = self.measure(lambda: self.wrk.fixed_rate(rate, a.duration, 1, a.rate_connections), trace, a.sink, agent_cpus=self.mode_cpus(mode), probe=probe, mode=mode, target_rps=rate)
                res = bpf_stats.delta(probe.before, w["probe"]["after"], w["nginx_served"]) if w.get("probe") else None
                if res is None:
                    continue
                out[mode] = report.bpf_mode_result(w, res)
                report.say_bpf_mode(mode, MODES[mode][3], res)
                say(bpf_stats.format_table(res))
        finally:
            bpf_stats.set_stats(previous)
        try:  # the timing's own cost per run, to read the programs' work apart from it
            floor = bpf_stats.measure_floor()
        except Exception as exc:  # noqa: BLE001 - a measurement aid; the table above stands without it
            say(f"  (timing floor not measured: {exc})")
        else:
            report.bpf_above_floor(out, floor["ns_per_run"])
        self.results["bpf"] = out

    def loss_sweep(self) -> None:
        a = self.args
        say(f"\n[loss] span loss at fixed rates {', '.join(f'{r:,}' for r in a.rates)} req/s, {a.loss_duration}s each; configurations: {', '.join(a.sweeps)}")
        sweep: dict[str, Any] = {}
        for config in a.sweeps:
            sink, where = config.split("@")
            runs = self.sweep_rates(config, sink, where)
            sweep[config] = report.loss_sweep_result(sink, where, runs)
            report.say_loss_sweep(config, sweep[config])
        self.results["loss_sweep"] = sweep

    def sweep_rates(self, config: str, sink: str, where: str) -> list[dict[str, Any]]:
        """One configuration's windows: --rates in order (stopping after two lossy ones), then --refine bisections."""
        a = self.args
        cpus = self.layout.agent_own if where == "own" else False
        say(f"  -- {config}: sink {sink}, agent on " + ("its own core" if where == "own" else "nginx's core") + f" (CPU {self.layout.agent_own if where == 'own' else self.layout.agent})")

        def at(rate: int) -> dict[str, Any]:
            return self.measure(lambda: self.wrk.fixed_rate(rate, a.loss_duration, 1, a.rate_connections), "nginx", sink, agent_cpus=cpus, target_rps=rate, mode="on", config=config)

        runs: list[dict] = []
        lossy_seen = 0
        for rate in a.rates:
            if lossy_seen >= 2 and not a.sweep_all:
                say(f"  (skipping {rate:,} and above: two lower rates lost spans; --sweep-all runs them)")
                break
            run = at(rate)
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
            runs.append(at(mid))
        runs.sort(key=lambda r: r["target_rps"])
        return runs

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
        self.results["startup"] = report.startup_result(runs, idle_cores)
