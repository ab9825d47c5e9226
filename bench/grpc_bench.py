#!/usr/bin/env python3
"""gRPC calls traced by otelbpf vs not: calls/s of the example service, spans/s, agent CPU per call.

Run as root from the repository::

    .venv/bin/python bench/grpc_bench.py                 # 3 rounds of 10 s per mode
    .venv/bin/python bench/grpc_bench.py --seconds 3 --rounds 1   # smoke check

examples/grpc_service.py serves; one client process (grpcio, a fresh channel per round)
calls Predict back to back. Rounds alternate agent off / agent on (``otelbpf run --pid
server --pid client``, attached before the round, stopped after it). Reported per mode:
calls/s (the client's count), the on/off ratio, spans/s (``otelbpf.spans.created`` over
the round) and the agent's CPU per call (its /proc ticks over the round). Figures are
indicative on a shared machine: compare ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
CLK_TCK = os.sysconf("SC_CLK_TCK")

#: Reads a number of seconds per line, opens a fresh channel, calls Predict for that long,
#: prints the call count.
DRIVER = f"""
import sys, time
sys.path.insert(0, {str(EXAMPLES)!r})
import grpc
from grpc_service import Client
port = int(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    seconds = float(line)
    with grpc.insecure_channel(f"127.0.0.1:{{port}}") as channel:
        client = Client(channel)
        client.predict(b"warm", timeout=10)
        calls, deadline = 0, time.monotonic() + seconds
        while time.monotonic() < deadline:
            client.predict(b"hello", timeout=10)
            calls += 1
    print(calls, flush=True)
"""


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def start_agent(server: int, client: int, out: Path, extra: list[str]) -> subprocess.Popen:
    agent = subprocess.Popen(
        [sys.executable, "-m", "otelbpf", "run", "--pid", str(server), "--pid", str(client), "--json-file", str(out), *extra],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    for line in agent.stderr:
        if line.startswith("otelbpf: tracing"):
            return agent
    raise RuntimeError("the agent did not start")


def stop_agent(agent: subprocess.Popen) -> dict:
    agent.send_signal(signal.SIGINT)
    stats = {}
    for line in agent.stderr:
        if line.startswith("otelbpf: stats "):
            stats = json.loads(line[len("otelbpf: stats ") :])
    agent.wait(timeout=60)
    return stats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of one round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per mode (alternated off, on, off, on ...)")
    parser.add_argument("--agent-arg", action="append", default=[], metavar="ARG",
                        help="one more argument for `otelbpf run` (repeat it), e.g. --agent-arg=--no-profiles: the "
                        "tracing alone (profiles are on by default, at 19 Hz of two busy processes)")
    args = parser.parse_args()

    server = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "grpc_service.py"), "serve", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    port = int(server.stdout.readline().split()[-1])
    client = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert client.stdout.readline().strip() == "ready"
    results: dict[str, list[dict]] = {"off": [], "on": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.rounds * 2):
                mode = "off" if i % 2 == 0 else "on"
                agent = start_agent(server.pid, client.pid, Path(tmp) / f"spans{i}.json", args.agent_arg) if mode == "on" else None
                ticks0 = cpu_ticks(agent.pid) if agent else 0
                client.stdin.write(f"{args.seconds}\n")
                client.stdin.flush()
                calls = int(client.stdout.readline())
                round_ = {"calls": calls, "calls_per_s": calls / args.seconds}
                if agent is not None:
                    time.sleep(0.5)  # let the agent drain the round's last events
                    cpu_s = (cpu_ticks(agent.pid) - ticks0) / CLK_TCK
                    stats = stop_agent(agent)
                    spans = stats.get("otelbpf.spans.created", 0)
                    round_.update(spans=spans, spans_per_s=spans / args.seconds,
                                  agent_cpu_us_per_call=cpu_s * 1e6 / max(calls, 1))  # fmt: skip
                results[mode].append(round_)
                print(f"round {i + 1} {mode}: {json.dumps(round_)}", flush=True)
    finally:
        client.kill()
        server.kill()
    off = statistics.median(r["calls_per_s"] for r in results["off"])
    on = statistics.median(r["calls_per_s"] for r in results["on"])
    summary = {
        "calls_per_s_off": round(off, 1),
        "calls_per_s_on": round(on, 1),
        "ratio_on_off": round(on / off, 3) if off else None,
        "spans_per_s": round(statistics.median(r["spans_per_s"] for r in results["on"]), 1),
        "spans_per_call": round(sum(r["spans"] for r in results["on"]) / max(1, sum(r["calls"] for r in results["on"])), 3),
        "agent_cpu_us_per_call": round(statistics.median(r["agent_cpu_us_per_call"] for r in results["on"]), 1),
    }
    print("summary " + json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
