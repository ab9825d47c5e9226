"""What the GPU probes cost a traced process, per call (indicative).

A worker process loads the stand-in driver (examples/cuda_standin) and times,
in a C loop (no ctypes per call), N ``cuLaunchKernel`` calls (entry-only
probe: a count in a BPF map) and N ``cuStreamSynchronize`` calls (entry +
return probes: one record per call), first with no agent, then with the agent
tracing it (``--pid``), then with the agent tracing it with
``--gpu-launch-time`` (launches: entry + return probes, their time summed in
BPF, still no record per launch). Prints nanoseconds per call and the
differences.

The stand-in functions do almost nothing, so the difference is the probe's
whole cost; a real launch takes ~9 us (docs/gpu.md). Needs root and the
repository's venv; run on a quiet machine for figures worth quoting.

    .venv/bin/python bench/gpu_probe_cost.py --calls 200000
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "examples" / "cuda_standin" / "build" / "libcuda.so.1"

WORKER = f"""
import ctypes, sys, time
lib = ctypes.CDLL({str(LIB)!r})
print("ready", flush=True)
for line in sys.stdin:
    what, n = line.split()
    fn = lib.standin_bench_launches if what == "launch" else lib.standin_bench_syncs
    start = time.perf_counter_ns()
    fn(ctypes.c_long(int(n)))
    print((time.perf_counter_ns() - start) / int(n), flush=True)
"""


def timed(worker: subprocess.Popen, what: str, calls: int, repeats: int) -> float:
    """Best of ``repeats``: ns per call."""
    best = float("inf")
    for _ in range(repeats):
        worker.stdin.write(f"{what} {calls}\n")
        worker.stdin.flush()
        best = min(best, float(worker.stdout.readline()))
    return best


def start_agent(pid: int, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    agent = subprocess.Popen(
        [sys.executable, "-m", "otelbpf", "run", "--pid", str(pid), "--json-file", os.devnull, *extra],
        cwd=ROOT, stderr=subprocess.PIPE, text=True,
    )
    for line in agent.stderr:
        if line.startswith("otelbpf: tracing,"):
            return agent
    raise SystemExit("the agent did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    subprocess.run(["make", "-s", "-C", str(LIB.parent.parent)], check=True)
    worker = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert worker.stdout.readline().strip() == "ready"
    results = {}
    try:
        results["off"] = {w: timed(worker, w, args.calls, args.repeats) for w in ("launch", "sync")}
        for mode, extra, what in (("traced", (), ("launch", "sync")), ("timed", ("--gpu-launch-time",), ("launch",))):
            agent = start_agent(worker.pid, extra)
            try:
                time.sleep(1.0)
                results[mode] = {w: timed(worker, w, args.calls, args.repeats) for w in what}
            finally:
                agent.terminate()
                agent.wait(timeout=60)
    finally:
        worker.kill()
    for what, mode, label in (
        ("launch", "traced", "cuLaunchKernel, entry-only (counted in BPF, the default)"),
        ("launch", "timed", "cuLaunchKernel, entry + return (--gpu-launch-time: counted and timed in BPF)"),
        ("sync", "traced", "cuStreamSynchronize (entry + return, one record)"),
    ):
        off, on = results["off"][what], results[mode][what]
        print(f"{label}: {off:.0f} ns/call off, {on:.0f} ns/call traced: +{on - off:.0f} ns")


if __name__ == "__main__":
    main()
