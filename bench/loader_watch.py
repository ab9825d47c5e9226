"""How soon after a library's load its calls are seen (the loader watch, bpf/loader.c).

One agent traces ``--servers`` fresh copies of examples/gpu_profile_server.py (a thread per
request, the stand-in CUDA libraries of examples/cuda_standin not yet loaded). Each gets one
``/load_and_allocate`` request: it dlopen()s libcudart.so.12 (and the driver it needs) and
makes ``--calls`` cudaMalloc calls of distinct sizes, ``--interval-us`` apart. From the
agent's cudaMalloc spans (OTLP JSON) the first call seen is read, and its offset after the
load is the delay: the loader's hook -> the agent woken -> the maps read -> the new file's
symbols parsed -> its probes attached. The first server pays the symbol parse of each file
(cached per file after); the others show the steady delay. With ``--no-watch`` the agent runs
without the loader probe (OTELBPF_LOADER_WATCH=off): the calls are found only by the periodic
re-scan (5 s) or never within the request.

    .venv/bin/python bench/loader_watch.py --servers 5
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
SERVER = ROOT / "examples" / "gpu_profile_server.py"
BASE = 1_000_000


def start_server() -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, str(SERVER), "--port", "0", "--thread-per-request"], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    return proc, int(line.split()[-1])


def start_agent(pids: list[int], out: Path, watch: bool, nice: int) -> subprocess.Popen:
    """The agent, its log in a file beside ``out`` (a pipe left unread would stall it)."""
    env = {**os.environ, "OTELBPF_LOADER_WATCH": "on" if watch else "off"}
    args = [sys.executable, "-m", "otelbpf", "--log-level", "debug", "run", *(a for pid in pids for a in ("--pid", str(pid))),
            "--json-file", str(out), "--gpu-min-call-duration", "0", "--no-profiles", "--nice", str(nice)]  # fmt: skip
    log = out.with_suffix(".log")
    with open(log, "w") as stderr:
        agent = subprocess.Popen(args, cwd=ROOT, env=env, stderr=stderr, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and agent.poll() is None:
        if "otelbpf: tracing," in log.read_text():
            return agent
        time.sleep(0.1)
    agent.kill()
    raise RuntimeError(f"the agent did not start: {log.read_text()[-2000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--interval-us", type=int, default=1000)
    parser.add_argument("--no-watch", action="store_true", help="without the loader probe (the periodic re-scan only)")
    parser.add_argument("--agent-nice", type=int, default=10, help="the agent's niceness (its default: 10)")
    args = parser.parse_args()
    from test_ebpf_http import spans_in_file

    subprocess.run(["make", "-s", "-C", str(ROOT / "examples" / "cuda_standin")], check=True)
    servers = []
    try:
        return _run(args, servers, spans_in_file)
    finally:
        for proc, _ in servers:
            proc.kill()


def _run(args, servers, spans_in_file) -> int:
    servers.extend(start_server() for _ in range(args.servers))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "spans.json"
        agent = start_agent([proc.pid for proc, _ in servers], out, watch=not args.no_watch, nice=args.agent_nice)
        answers = {}
        try:
            for proc, port in servers:
                url = f"http://127.0.0.1:{port}/load_and_allocate?count={args.calls}&interval_us={args.interval_us}&bytes={BASE}"
                with urllib.request.urlopen(url, timeout=60) as response:
                    answers[proc.pid] = json.load(response)
                time.sleep(0.5)
        finally:
            time.sleep(1)
            for proc, _ in servers:
                proc.kill()
            agent.send_signal(2)
            agent.wait(600)  # detaching uprobes waits an RCU grace period each: slow on a busy VM
        attach_ms = [float(m) for m in re.findall(r"loader: pid \d+: \d+ probes attached in ([\d.]+) ms", out.with_suffix(".log").read_text())]
        seen: dict[int, list[int]] = {}
        for span in spans_in_file(out):
            if span.span.name == "cudaMalloc":
                seen.setdefault(int(span.resource.get("process.pid")), []).append(int(span.attributes["otelbpf.gpu.memory.bytes"]) - BASE)
    delays = []
    print(f"{'server':>8} {'first seen call':>16} {'its offset after the load':>26} {'calls seen':>11}")
    for index, (proc, _) in enumerate(servers):
        calls = sorted(seen.get(proc.pid, []))
        offsets = answers[proc.pid]["offsets_us"]
        if calls:
            delays.append(offsets[calls[0]] / 1000)
            print(f"{index:>8} {calls[0]:>16} {offsets[calls[0]] / 1000:>23.1f} ms {len(calls):>5}/{args.calls}")
        else:
            print(f"{index:>8} {'none':>16} {'-':>26} {0:>5}/{args.calls}")
    if delays:
        later = delays[1:] or delays
        print(f"delay after the load: first server {delays[0]:.1f} ms (symbols parsed), others median "
              f"{statistics.median(later):.1f} ms, max {max(later):.1f} ms; load average {os.getloadavg()[0]:.2f}")
    if attach_ms:
        print(f"the agent's read of the maps and attach after a load event: median {statistics.median(attach_ms):.1f} ms, "
              f"max {max(attach_ms):.1f} ms ({len(attach_ms)} events that attached)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
