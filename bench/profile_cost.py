#!/usr/bin/env python3
"""What CPU profiles cost a CPU-bound Python service, side by side with the agent tracing without them.

A Python HTTP service that burns ~1 ms of CPU per request (pure Python, Debian's
python3: no frame pointers, so every sample is a full stack copy, a CPython frame walk
and a DWARF unwind) is driven by wrk for --duration seconds per run. Each round runs
the modes in turn on a fresh service and a fresh agent:

  off    the agent tracing the service with --no-profiles (the baseline)
  p19    the same with profiles at 19 Hz (the default)
  p99    the same at 99 Hz
  p999   the same at 999 Hz: ten times the samples of p99, so the agent's cost per sample
         is measured over thousands of them, not lost in its per-run fixed costs
  (none  no agent at all, with --with-none)

and reports per mode (medians over rounds; ratios pair by pair within a round):

  req/s and its ratio to `off`      what profiling takes from the service's throughput
  samples, lost                     stack samples taken, and dropped for a full ring
  BPF ns/run, ns/sample             run time of profile_on_cpu (kernel.bpf_stats_enabled
                                    during the window: two clock reads per BPF run) per run
                                    (most runs are the filter rejecting other processes) and
                                    all of it per sample taken
  agent us/sample (steady)          the agent's CPU (user+sys, every thread) per sample while
                                    the load runs, between its first and last self-metrics line
                                    inside the load (every STATS_INTERVAL_S; profiles are
                                    exported every PROFILE_INTERVAL_S, so export is part of it),
                                    minus what the same round's `off` agent spent per second on
                                    the requests, scaled to this run's request rate
  agent us/sample (to exit)         the same from the start of the load to the agent's exit:
                                    also the export of what is held at exit and the teardown,
                                    whose spread (tens of ms) is large against a few hundred
                                    samples at 19 Hz
  agent us/sample (own)             the agent's own count of its CPU on the samples
                                    (otelbpf.profiles.cpu_time: decoding, linking, building,
                                    encoding and writing them) per sample, over the steady
                                    window; no `off` run is subtracted, so it holds on the HTTP
                                    service too, where tracing the requests moves the agent's
                                    CPU between runs by more than the samples cost
  agent peak RSS                    VmHWM of the agent at the end

and, per pair of profiled modes, the agent CPU per extra sample between them in a round
(what one more sample costs, without the per-run fixed costs: opening the process's
modules, naming each code object and each PC the first time).

The service runs alone on CPU 0, the agent and wrk on CPU 1 (--no-pin: wherever the scheduler
puts them).

--rate N drives the HTTP service at N requests a second from a paced client (one keep-alive
connection) instead of wrk at saturation: the service is not saturated, so the agent's
CPU per second ("agent ms/s") compares directly between modes.

Before each measured load the same load runs --warmup seconds (default 3): the agent's first
sight of the service (finding its CPython, its symbols, its threads' states) costs tens of ms
once and is reported apart. Round N's agents all run with PYTHONHASHSEED=N (--random-hash-seed:
each its own), as string hashing moves the agent's CPU on the same requests by more than the
difference measured.

--service spin runs the same Python code in a loop under as deep a stack, and sends no
requests: the agent has nothing but the samples to handle, so the `off` subtraction does
not carry the tracing's run-to-run spread (tens of microseconds per request).

    sudo .venv/bin/python bench/profile_cost.py --rounds 2 --duration 30 --modes off,p19,p99
    sudo .venv/bin/python bench/profile_cost.py --rounds 2 --duration 30 --modes off,p19,p99 --service spin
    sudo .venv/bin/python bench/profile_cost.py --rounds 3 --duration 10      # + p999, to-exit figures
    sudo .venv/bin/python bench/profile_cost.py --rounds 2 --duration 30 --modes off,p19 --rate 200
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from bpf_stats import delta, set_stats, snapshot  # noqa: E402

PYTHON = os.environ.get("PROFILE_BENCH_PYTHON", "/usr/bin/python3")
#: The CPU-bound Python code both services run (a pure-Python loop, no native call).
BURN = r'''
import sys
def burn(n):
    x = 0
    for i in range(n):
        x += i * i
    return x
def handle():
    return burn(int(sys.argv[2]))
'''
SERVICE = BURN + r'''
import http.server
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # head and body are two writes: no delayed-ACK stall between them
    def do_GET(self):
        body = str(handle()).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H)
print("listening", flush=True)
server.serve_forever()
'''
#: --service spin: the same Python code, called in a loop under as deep a stack as the
#: server's, and no requests: the agent has nothing to trace but the stack samples, so its
#: CPU beyond the `off` run is the profiles' alone (the HTTP service's tracing varies by
#: tens of microseconds per request between runs, which a per-sample figure inherits).
SPINNER = BURN + r'''
def serve(depth):
    if depth:
        return serve(depth - 1)
    while True:
        handle()
print("listening", flush=True)
serve(int(sys.argv[1]))
'''
SPIN_DEPTH = 10
MODES = {
    "off": ["--no-profiles"],
    "p19": ["--profile-hz", "19"],
    "p99": ["--profile-hz", "99"],
    # per-sample cost dominates the agent's CPU here: the marginal against `off` is measured
    # over ~10x the samples of p99, so the fixed per-run costs weigh 10x less per sample
    "p999": ["--profile-hz", "999"],
}
DEFAULT_MODES = "off,p19,p99,p999"
#: The agent logs its self-metrics this often; the steady figures run between two such lines.
#: Not shorter: an idle agent wakes once a second anyway (otelbpf/runtime/agent.py, IDLE_WAIT_MAX_S),
#: and a line every 0.5 s doubled its wake-ups, each of which reads the samples held since
#: the last from cold caches (--service spin, 19 Hz: 53.5 us a sample at 0.5 s, 35.5 at 1 s).
STATS_INTERVAL_S = 1.0
#: CPU placement (--no-pin: none): the service alone on CPU 0, the agent and wrk on CPU 1.
#: Unpinned, where the scheduler put the agent against the service moved the `off` agent's
#: CPU by 20.3-34.7 ms/s between runs, more than 99 Hz of samples cost.
PIN = {"service": "0", "agent": "1", "client": "1"}
#: ... and exports profiles this often (--profile-interval; the agent's default): a steady
#: window takes in an export every so many seconds, so make --duration a few times this.
PROFILE_INTERVAL_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` now, in seconds, at nanosecond resolution
    (schedstat's sum_exec_runtime; /proc/PID/stat's ticks are 10 ms); ticks where
    schedstat is missing."""
    total, seen = 0, False
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        tids = []
    for tid in tids:
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            seen = True
        except (OSError, ValueError, IndexError):
            pass
    if seen:
        return total / 1e9
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    match = re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(match.group(1)) / 1024 if match else 0.0


def pinned(role: str, argv: list[str]) -> list[str]:
    """``argv`` run on ``role``'s CPUs (PIN), or as it is when pinning is off."""
    cpus = PIN.get(role) if PIN else None
    return ["taskset", "-c", cpus, *argv] if cpus is not None else argv


def start_service(port: int, work: int, spin: bool = False) -> subprocess.Popen:
    argv = [PYTHON, "-c", SPINNER, str(SPIN_DEPTH), str(work)] if spin else [PYTHON, "-c", SERVICE, str(port), str(work)]
    proc = subprocess.Popen(pinned("service", argv), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "listening"
    return proc


#: The agents of one round run with this PYTHONHASHSEED (the round's number; None: random).
#: String hashing moves every dict's layout, and with it the agent's CPU on the same
#: requests: `off` runs with random seeds read 33-52 ms/s on this VM at 200 req/s, with one
#: seed 35.5-37.5. Each round takes another seed, so no one layout decides the result.
HASH_SEED: int | None = None


#: Where profiles go: what the agent does with a sample after building it differs a lot.
OUTPUTS = {
    "json": lambda out: ["--profiles-json-file", str(out / "p.json")],  # OTLP encoding + protobuf's JSON printer
    "pprof": lambda out: ["--pprof-dir", str(out / "pprof")],
    "flamegraph": lambda out: ["--flamegraph", str(out / "f.html")],
    # OTLP/gRPC, as a Collector would get them (the spans too, in every mode): OTLP encoding
    # and protobuf serialization, to bench/otlp_counting_receiver.py in a child process
    "otlp": lambda out: ["--otlp-endpoint", OTLP_ENDPOINT, "--otlp-protocol", "grpc"],
}
OUTPUT = "json"
#: --output otlp: the receiver's gRPC endpoint (start_receiver)
OTLP_ENDPOINT = ""


def start_receiver() -> subprocess.Popen:
    """bench/otlp_counting_receiver.py (decodes with the official protobufs, keeps no spans),
    pinned with wrk; sets OTLP_ENDPOINT."""
    global OTLP_ENDPOINT
    script = ROOT / "bench" / "otlp_counting_receiver.py"
    proc = subprocess.Popen(pinned("client", [sys.executable, str(script)]), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        raise RuntimeError(f"the OTLP receiver did not start (got {line!r})")
    OTLP_ENDPOINT = f"http://127.0.0.1:{json.loads(line[len('READY '):])['grpc_port']}"
    return proc


class StatsLines(threading.Thread):
    """Reads the agent's self-metrics lines as they come: (monotonic, agent CPU s, samples, the
    agent's own count of its CPU on profiles in s) each."""

    def __init__(self, agent: subprocess.Popen) -> None:
        super().__init__(daemon=True)
        self.agent = agent
        self.points: list[tuple[float, float, int, float]] = []
        self.last: dict = {}

    def run(self) -> None:
        for line in self.agent.stderr:
            if line.startswith("otelbpf: stats "):
                stats = json.loads(line[len("otelbpf: stats ") :])
                try:
                    cpu = cpu_seconds(self.agent.pid)
                except OSError:  # exiting
                    cpu = None
                self.last = stats
                if cpu is not None:
                    self.points.append((time.monotonic(), cpu, samples_of(stats), own_profile_cpu_s(stats)))

    def between(self, start: float, end: float) -> tuple[float, float, int, float] | None:
        """(seconds, agent CPU seconds, samples, the agent's own profile CPU seconds) between
        the first and last line in [start, end]."""
        inside = [p for p in self.points if start <= p[0] <= end]
        if len(inside) < 2:
            return None
        (t0, c0, s0, p0), (t1, c1, s1, p1) = inside[0], inside[-1]
        return t1 - t0, c1 - c0, s1 - s0, p1 - p0


def counted(stats: dict, name: str) -> int:
    """A self-metric of a stats line summed over its labels (``name{label}`` keys)."""
    return sum(v for k, v in stats.items() if k.startswith(name + "{"))


def samples_of(stats: dict) -> int:
    return counted(stats, "otelbpf.profiles.samples")


def own_profile_cpu_s(stats: dict) -> float:
    """The agent's own count of its CPU on profiles (otelbpf.profiles.cpu_time, us, every stage)."""
    return counted(stats, "otelbpf.profiles.cpu_time") / 1e6


def start_agent(pid: int, extra: list[str], out: Path) -> tuple[subprocess.Popen, StatsLines]:
    args = [sys.executable, "-m", "otelbpf", "run", "--pid", str(pid), "--json-file", str(out / "t.json"),
            "--stats-interval", str(STATS_INTERVAL_S), "--profile-interval", f"{PROFILE_INTERVAL_S:g}",
            *OUTPUTS[OUTPUT](out), *extra]  # fmt: skip
    env = dict(os.environ, PYTHONHASHSEED=str(HASH_SEED)) if HASH_SEED is not None else None
    agent = subprocess.Popen(pinned("agent", args), stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    for line in agent.stderr:
        if line.startswith("otelbpf: tracing,"):
            lines = StatsLines(agent)
            lines.start()
            return agent, lines
    raise RuntimeError(f"agent did not start: {agent.wait()}")


def stop_agent(agent: subprocess.Popen, lines: StatsLines) -> tuple[dict, float]:
    """Stops the agent (SIGINT: it exports what it holds and exits); its last stats and
    the CPU seconds it used in its whole life (wait4's rusage, microseconds)."""
    agent.send_signal(signal.SIGINT)
    _, status, usage = os.wait4(agent.pid, 0)
    agent.returncode = os.waitstatus_to_exitcode(status)
    lines.join(30)
    return lines.last, usage.ru_utime + usage.ru_stime


def wrk(port: int, seconds: float) -> float:
    done = subprocess.run(pinned("client", ["wrk", "-t1", "-c1", f"-d{seconds:g}s", f"http://127.0.0.1:{port}/"]),
                          capture_output=True, text=True)  # fmt: skip
    match = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
    if not match:
        raise RuntimeError(f"wrk: {done.stdout}{done.stderr}")
    return float(match.group(1))


PACED_CLIENT = r'''
import http.client, sys, time
port, rate, seconds = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
conn = http.client.HTTPConnection("127.0.0.1", port)
start = time.monotonic(); done = 0
while True:
    due = start + done / rate
    now = time.monotonic()
    if due - start >= seconds:
        break
    if due > now:
        time.sleep(due - now)
    conn.request("GET", "/"); conn.getresponse().read(); done += 1
print(done / (time.monotonic() - start))
'''


def paced(port: int, rate: float, seconds: float) -> float:
    """``rate`` requests a second on one keep-alive connection (Python's http.client), for
    ``seconds``: the load of a service that is not saturated, where the agent's CPU per
    second compares directly between modes (wrk saturates, and a mode that changes the
    service's throughput changes the agent's work with it). Returns the rate achieved."""
    done = subprocess.run(pinned("client", [PYTHON, "-c", PACED_CLIENT, str(port), f"{rate:g}", f"{seconds:g}"]),
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"paced client: {done.stderr}")
    return float(done.stdout)


def drive(port: int, args, seconds: float) -> float:
    """The HTTP service's load for ``seconds``: paced at --rate, or wrk at saturation."""
    return paced(port, args.rate, seconds) if args.rate else wrk(port, seconds)


def run_mode(mode: str, args, out: Path) -> dict:
    port = free_port()
    spin = args.service == "spin"
    service = start_service(port, args.work, spin)
    agent = None
    try:
        if mode != "none":
            agent, lines = start_agent(service.pid, MODES[mode], out)
        time.sleep(0.5)
        warmup_cpu_s = None
        if args.warmup and not spin:
            # the agent's first sight of the service (finding its CPython, reading its symbols and
            # thread states) costs tens of ms of CPU once: it is measured apart (warmup_cpu_s,
            # against the `off` agent's on the same load), not spread over the steady window
            started_cpu = cpu_seconds(agent.pid) if agent else 0.0
            drive(port, args, args.warmup)
            time.sleep(1.0)
            if agent:
                warmup_cpu_s = cpu_seconds(agent.pid) - started_cpu
        before_cpu = cpu_seconds(agent.pid) if agent else 0.0
        before_bpf = snapshot(agent.pid) if agent else {}
        load_start = time.monotonic()
        if spin:
            time.sleep(args.duration)
            rate = None
        else:
            rate = drive(port, args, args.duration)
        load_end = time.monotonic()
        result = {"mode": mode, "rps": rate}
        if warmup_cpu_s is not None:
            result["warmup_cpu_s"] = warmup_cpu_s
        if agent:
            steady = lines.between(load_start, load_end)
            if steady is not None:
                result["steady_s"], result["steady_cpu_s"], result["steady_samples"], result["own_cpu_s"] = steady
            bpf = delta(before_bpf, snapshot(agent.pid))
            sample_prog = [p for p in bpf["programs"] if p["name"].startswith("profile_on_cpu")]
            result["bpf_runs"] = sum(p["runs"] for p in sample_prog)
            result["bpf_ns"] = sum(p["ns"] for p in sample_prog)
            result["peak_rss_mb"] = peak_rss_mb(agent.pid)
            stats, total_cpu = stop_agent(agent, lines)
            agent = None
            # to the agent's exit: the samples still held are exported at exit, with the teardown
            result["agent_cpu_s"] = total_cpu - before_cpu
            result["samples"] = samples_of(stats)
            result["lost"] = stats.get("otelbpf.profiles.lost", 0)
            result["exports"] = counted(stats, "otelbpf.profiles.exports")
            result["export_failures"] = counted(stats, "otelbpf.profiles.export.failures")
        return result
    finally:
        if agent is not None:
            agent.kill()
        service.kill()
        service.wait()


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def marginal_us(row: dict, off: dict) -> float | None:
    """The agent's CPU per sample in ``row`` beyond what tracing alone costs: the
    same round's `off` agent CPU per request, scaled to ``row``'s requests (a mode
    that slows the service also gives the agent fewer requests to trace)."""
    if not row.get("samples"):
        return None
    return (row["agent_cpu_s"] - _tracing_cpu(row, off)) * 1e6 / row["samples"]


def _tracing_cpu(row: dict, off: dict) -> float:
    """The agent CPU of ``row``'s run that is not the profiles': the `off` run's, per request
    when there are requests (--service spin has none)."""
    if row.get("rps") and off.get("rps"):
        return off["agent_cpu_s"] * row["rps"] / off["rps"]
    return off["agent_cpu_s"]


def steady_us(row: dict, off: dict) -> float | None:
    """The agent's CPU per sample while the load ran, beyond what `off` spent per second
    on tracing (scaled to ``row``'s request rate)."""
    if not row.get("steady_samples") or not off.get("steady_s"):
        return None
    tracing_per_s = off["steady_cpu_s"] / off["steady_s"]
    if row.get("rps") and off.get("rps"):
        tracing_per_s *= row["rps"] / off["rps"]
    return (row["steady_cpu_s"] - tracing_per_s * row["steady_s"]) * 1e6 / row["steady_samples"]


def own_us(row: dict) -> float | None:
    """The agent's own count of its CPU on the samples (otelbpf.profiles.cpu_time, every stage)
    per sample, over the steady window: no `off` run subtracted, so the run-to-run spread of
    tracing the requests is not in it (what the agent spends around the samples is: waking for
    them, their share of the reorder window)."""
    if not row.get("steady_samples") or row.get("own_cpu_s") is None:
        return None
    return row["own_cpu_s"] * 1e6 / row["steady_samples"]


def slope_us(low: dict, high: dict, off: dict) -> float | None:
    """The agent's CPU per sample between two rates of one round: what each extra
    sample costs, without the per-run fixed costs (opening the process's modules,
    naming its code objects the first time, loading the kernel's symbols) that
    weigh on the per-sample figure of a short run at a low rate."""
    if not high.get("samples") or high["samples"] <= low.get("samples", 0):
        return None
    extra = [row["agent_cpu_s"] - _tracing_cpu(row, off) for row in (low, high)]
    return (extra[1] - extra[0]) * 1e6 / (high["samples"] - low["samples"])


def report(rounds: list[dict[str, dict]], modes: list[str]) -> str:
    lines = ["mode   req/s     x off   samples  lost  BPF ns/run  BPF ns/sample  agent us/sample (steady, to exit, own)  "
             "agent ms/s  agent peak RSS MB"]  # fmt: skip
    for mode in modes:
        rows = [r[mode] for r in rounds]
        ratio = median([r[mode]["rps"] / r["off"]["rps"] for r in rounds if r[mode]["rps"] and r["off"]["rps"]])
        us = median([marginal_us(r[mode], r["off"]) for r in rounds if mode not in ("off", "none")])
        steady = median([steady_us(r[mode], r["off"]) for r in rounds if mode not in ("off", "none")])
        own = median([own_us(row) for row in rows])
        per_s = median([row["steady_cpu_s"] * 1e3 / row["steady_s"] for row in rows if row.get("steady_s")])
        per_run = median([row["bpf_ns"] / row["bpf_runs"] for row in rows if row.get("bpf_runs")])
        bpf = median([row["bpf_ns"] / row["samples"] for row in rows if row.get("samples")])
        lines.append(
            f"{mode:<6} {median([row['rps'] for row in rows]) or float('nan'):>8.1f}  {ratio or float('nan'):>6.3f}  "
            f"{median([row.get('samples') for row in rows]) or 0:>7.0f}  {median([row.get('lost') for row in rows]) or 0:>4.0f}  "
            f"{per_run if per_run is not None else float('nan'):>10.0f}  "
            f"{bpf if bpf is not None else float('nan'):>13.0f}  "
            f"{steady if steady is not None else float('nan'):>21.1f}, {us if us is not None else float('nan'):>8.1f}, "
            f"{own if own is not None else float('nan'):>5.1f}  "
            f"{per_s if per_s is not None else float('nan'):>10.2f}  {median([row.get('peak_rss_mb') for row in rows]) or 0:>17.0f}"
        )
    profiled = [mode for mode in modes if mode not in ("off", "none")]
    for mode in profiled:  # the run-to-run spread of the tracing cancels within a round
        extra = [r[mode]["steady_cpu_s"] * 1e3 / r[mode]["steady_s"] - r["off"]["steady_cpu_s"] * 1e3 / r["off"]["steady_s"]
                 for r in rounds if r[mode].get("steady_s") and r["off"].get("steady_s")]  # fmt: skip
        values = ", ".join(f"{v:+.2f}" for v in extra)
        lines.append(f"agent ms/s over off, {mode}, paired by round: {median(extra) or float('nan'):+.2f} (rounds: {values})")
    for mode in profiled:  # --warmup: what the first sight of the service cost, over the tracing of the same load
        extra = [(r[mode]["warmup_cpu_s"] - r["off"]["warmup_cpu_s"]) * 1e3 for r in rounds
                 if "warmup_cpu_s" in r[mode] and "warmup_cpu_s" in r["off"]]  # fmt: skip
        if extra:
            values = ", ".join(f"{v:+.0f}" for v in extra)
            lines.append(f"agent ms in the warm-up over off (first sight of the service), {mode}: "
                         f"{median(extra):+.0f} (rounds: {values})")  # fmt: skip
    for low, high in zip(profiled, profiled[1:]):
        slopes = [slope_us(r[low], r[high], r["off"]) for r in rounds]
        values = ", ".join(f"{v:.1f}" for v in slopes if v is not None)
        lines.append(f"agent us per extra sample, {low} -> {high}: {median(slopes) or float('nan'):.1f} (rounds: {values})")
    return "\n".join(lines)


def main() -> int:
    global OUTPUT, PROFILE_INTERVAL_S, PIN, HASH_SEED
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=8.0, help="seconds of load per run (default 8)")
    p.add_argument("--work", type=int, default=40000, help="loop iterations per request (~1 ms on this VM)")
    p.add_argument("--with-none", action="store_true", help="also run without any agent")
    p.add_argument("--modes", default=DEFAULT_MODES, help=f"comma-separated, `off` first (default {DEFAULT_MODES})")
    p.add_argument("--service", choices=("http", "spin"), default="http",
                   help="http: the HTTP service under wrk (default); spin: the same code in a loop, no requests "
                   "(the agent's per-sample CPU without the tracing's run-to-run spread)")
    p.add_argument("--output", choices=sorted(OUTPUTS), default="json",
                   help="where profiles go (default json: OTLP JSON lines; otlp: OTLP/gRPC to a local receiver)")
    p.add_argument("--rate", type=float, help="http: this many requests a second from a paced client instead of "
                   "wrk at saturation (the agent's CPU per second then compares directly between modes)")
    p.add_argument("--warmup", type=float, default=3.0,
                   help="http: seconds of the same load before the measured one (default 3; 0: none). The agent's "
                   "first sight of the service costs a few hundred ms of CPU once, which would otherwise fall "
                   "into the first seconds of the window; it is reported apart (first-sight CPU)")
    p.add_argument("--random-hash-seed", action="store_true",
                   help="let every agent pick its own PYTHONHASHSEED (default: round N's agents all run with seed N)")
    p.add_argument("--json", metavar="PATH", help="write every run's figures here")
    p.add_argument("--no-pin", action="store_true", help="leave CPU placement to the scheduler (default: service on CPU 0, agent and wrk on CPU 1)")
    p.add_argument("--profile-interval", type=float, default=PROFILE_INTERVAL_S,
                   help=f"the agent's export interval, s (default {PROFILE_INTERVAL_S:g}, the agent's own)")
    args = p.parse_args()
    if os.geteuid() != 0 or (args.service == "http" and not shutil.which("wrk")):
        print("profile_cost: run as root, with wrk installed (scripts/install.sh)", file=sys.stderr)
        return 2
    OUTPUT = args.output
    PROFILE_INTERVAL_S = args.profile_interval
    if args.no_pin or (os.cpu_count() or 1) < 2:
        PIN = {}
    modes = [m for m in args.modes.split(",") if m]
    if not modes or modes[0] != "off" or any(m not in MODES for m in modes):
        print(f"profile_cost: --modes: `off` first, then any of {', '.join(MODES)}", file=sys.stderr)
        return 2
    modes = (["none"] if args.with_none else []) + modes
    rounds = []
    previous = set_stats(True)
    receiver = start_receiver() if OUTPUT == "otlp" else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for number in range(args.rounds):
                HASH_SEED = None if args.random_hash_seed else number + 1
                round_ = {}
                for mode in modes:
                    round_[mode] = run_mode(mode, args, Path(tmp))
                    print(f"round {number + 1} {mode}: {json.dumps(round_[mode])}", flush=True)
                rounds.append(round_)
    finally:
        set_stats(previous)
        if receiver is not None:
            receiver.stdin.close()  # EOF: it stops
            receiver.wait(10)
    print(report(rounds, modes))
    if args.json:
        Path(args.json).write_text(json.dumps(rounds, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
