#!/usr/bin/env python3
"""What CPU profiles cost a CPU-bound Python service, side by side with the agent tracing without them.

A Python HTTP service that burns ~1 ms of CPU per request (pure Python, Debian's
python3: no frame pointers, so every sample is a full stack copy, a CPython frame walk
and a DWARF unwind) is driven by wrk for --duration seconds per run. Each round runs
the modes in turn on a fresh service and a fresh agent:

  off    the agent tracing the service with --no-profiles (the baseline)
  p19    the same with profiles at 19 Hz (the default)
  p99    the same at 99 Hz
  (none  no agent at all, with --with-none)

and reports per mode (medians over rounds; ratios pair by pair within a round):

  req/s and its ratio to `off`      what profiling takes from the service's throughput
  samples, lost                     stack samples taken, and dropped for a full ring
  BPF ns/run, ns/sample             run time of profile_on_cpu (kernel.bpf_stats_enabled
                                    during the window: two clock reads per BPF run) per run
                                    (most runs are the filter rejecting other processes) and
                                    all of it per sample taken
  agent us/sample                   agent CPU (user+sys) over the window, minus the
                                    same round's `off` agent CPU, per sample
  agent peak RSS                    VmHWM of the agent at the end

    sudo .venv/bin/python bench/profile_cost.py --rounds 3 --duration 8
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from bpf_stats import delta, set_stats, snapshot  # noqa: E402

PYTHON = os.environ.get("PROFILE_BENCH_PYTHON", "/usr/bin/python3")
SERVICE = r'''
import http.server, sys
def burn(n):
    x = 0
    for i in range(n):
        x += i * i
    return x
def handle():
    return burn(int(sys.argv[2]))
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
MODES = {"off": ["--no-profiles"], "p19": ["--profile-hz", "19"], "p99": ["--profile-hz", "99"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    match = re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(match.group(1)) / 1024 if match else 0.0


def start_service(port: int, work: int) -> subprocess.Popen:
    proc = subprocess.Popen([PYTHON, "-c", SERVICE, str(port), str(work)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "listening"
    return proc


#: Where profiles go: what the agent does with a sample after building it differs a lot.
OUTPUTS = {
    "json": lambda out: ["--profiles-json-file", str(out / "p.json")],  # OTLP encoding + protobuf's JSON printer
    "pprof": lambda out: ["--pprof-dir", str(out / "pprof")],
    "flamegraph": lambda out: ["--flamegraph", str(out / "f.html")],
}
OUTPUT = "json"


def start_agent(pid: int, extra: list[str], out: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "otelbpf", "run", "--pid", str(pid), "--json-file", str(out / "t.json"),
            *OUTPUTS[OUTPUT](out), *extra]  # fmt: skip
    agent = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    for line in agent.stderr:
        if line.startswith("otelbpf: tracing,"):
            return agent
    raise RuntimeError(f"agent did not start: {agent.wait()}")


def stop_agent(agent: subprocess.Popen) -> dict:
    agent.send_signal(signal.SIGINT)
    stats = {}
    for line in agent.stderr:
        if line.startswith("otelbpf: stats "):
            stats = json.loads(line[len("otelbpf: stats ") :])
    agent.wait(timeout=60)
    return stats


def wrk(port: int, seconds: float) -> float:
    done = subprocess.run(["wrk", "-t1", "-c1", f"-d{seconds:g}s", f"http://127.0.0.1:{port}/"], capture_output=True, text=True)
    match = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
    if not match:
        raise RuntimeError(f"wrk: {done.stdout}{done.stderr}")
    return float(match.group(1))


def run_mode(mode: str, args, out: Path) -> dict:
    port = free_port()
    service = start_service(port, args.work)
    agent = None
    try:
        if mode != "none":
            agent = start_agent(service.pid, MODES[mode], out)
        time.sleep(0.5)
        before_cpu = cpu_seconds(agent.pid) if agent else 0.0
        before_bpf = snapshot(agent.pid) if agent else {}
        rate = wrk(port, args.duration)
        result = {"mode": mode, "rps": rate}
        if agent:
            result["agent_cpu_s"] = cpu_seconds(agent.pid) - before_cpu
            bpf = delta(before_bpf, snapshot(agent.pid))
            sample_prog = [p for p in bpf["programs"] if p["name"].startswith("profile_on_cpu")]
            result["bpf_runs"] = sum(p["runs"] for p in sample_prog)
            result["bpf_ns"] = sum(p["ns"] for p in sample_prog)
            result["peak_rss_mb"] = peak_rss_mb(agent.pid)
            stats = stop_agent(agent)
            agent = None
            result["samples"] = sum(v for k, v in stats.items() if k.startswith("otelbpf.profiles.samples{"))
            result["lost"] = stats.get("otelbpf.profiles.lost", 0)
        return result
    finally:
        if agent is not None:
            agent.kill()
        service.kill()
        service.wait()


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def report(rounds: list[dict[str, dict]], modes: list[str]) -> str:
    lines = ["mode   req/s     x off   samples  lost  BPF ns/run  BPF ns/sample  agent us/sample  agent peak RSS MB"]
    for mode in modes:
        rows = [r[mode] for r in rounds]
        ratio = median([r[mode]["rps"] / r["off"]["rps"] for r in rounds])
        us = median([
            (r[mode]["agent_cpu_s"] - r["off"]["agent_cpu_s"]) * 1e6 / r[mode]["samples"]
            for r in rounds if mode not in ("off", "none") and r[mode].get("samples")
        ])  # fmt: skip
        per_run = median([row["bpf_ns"] / row["bpf_runs"] for row in rows if row.get("bpf_runs")])
        bpf = median([row["bpf_ns"] / row["samples"] for row in rows if row.get("samples")])
        lines.append(
            f"{mode:<6} {median([row['rps'] for row in rows]):>8.1f}  {ratio:>6.3f}  "
            f"{median([row.get('samples') for row in rows]) or 0:>7.0f}  {median([row.get('lost') for row in rows]) or 0:>4.0f}  "
            f"{per_run if per_run is not None else float('nan'):>10.0f}  "
            f"{bpf if bpf is not None else float('nan'):>13.0f}  {us if us is not None else float('nan'):>15.1f}  "
            f"{median([row.get('peak_rss_mb') for row in rows]) or 0:>17.0f}"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=8.0, help="seconds of load per run (default 8)")
    p.add_argument("--work", type=int, default=40000, help="loop iterations per request (~1 ms on this VM)")
    p.add_argument("--with-none", action="store_true", help="also run without any agent")
    p.add_argument("--output", choices=sorted(OUTPUTS), default="json", help="where profiles go (default json: OTLP JSON lines)")
    p.add_argument("--json", metavar="PATH", help="write every run's figures here")
    args = p.parse_args()
    if os.geteuid() != 0 or not shutil.which("wrk"):
        print("profile_cost: run as root, with wrk installed (scripts/install.sh)", file=sys.stderr)
        return 2
    global OUTPUT
    OUTPUT = args.output
    modes = (["none"] if args.with_none else []) + list(MODES)
    rounds = []
    previous = set_stats(True)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for number in range(args.rounds):
                round_ = {}
                for mode in modes:
                    round_[mode] = run_mode(mode, args, Path(tmp))
                    print(f"round {number + 1} {mode}: {json.dumps(round_[mode])}", flush=True)
                rounds.append(round_)
    finally:
        set_stats(previous)
    print(report(rounds, modes))
    if args.json:
        Path(args.json).write_text(json.dumps(rounds, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
