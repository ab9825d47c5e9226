"""What the GPU probes cost a traced process, per call (indicative).

A worker process loads the stand-in driver (examples/cuda_standin) and times,
in a C loop (no ctypes per call), N ``cuLaunchKernel`` calls (entry-only
probe: a count in a BPF map) and N ``cuStreamSynchronize`` calls (entry +
return probes: one record per call), first with no agent, then with the agent
tracing it (``--pid``), then with the agent tracing it with
``--gpu-launch-time`` (launches: entry + return probes, their time summed in
BPF, still no record per launch). Prints nanoseconds per call and the
differences.

GPU profiles (on by default with profiles): the same calls with the GPU probes taking no stack
(``--no-gpu-profiles``) and taking one (the default: a stack sample at each allocation and
synchronisation, 1 launch in ``--gpu-launch-sample-every`` (128)); ``alloc`` times a
cuMemAlloc_v2 + cuMemFree_v2 pair (the free takes no stack), so its difference between the
two is the cost of an allocation's stack.

Then the aggregation's absorption: ``--absorb`` launches as fast as the C
loop goes under the agent (default mode), reporting the launch rate the
traced process kept, how many events reached the agent's user space in all
(process start and the like: launches are never sent one by one) and the
launch total the agent exported from the BPF map
(``otelbpf.gpu.kernel.launches``), which must equal what was launched.

The stand-in functions do almost nothing, so the difference is the probe's
whole cost; a real launch takes ~9 us (docs/gpu.md). Needs root and the
repository's venv; run on a quiet machine for figures worth quoting.

    .venv/bin/python bench/gpu_probe_cost.py --calls 200000
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
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
    start = time.perf_counter_ns()
    if what == "alloc":  # cuMemAlloc_v2 (a stack with GPU profiles) + cuMemFree_v2 (none) per call
        lib.standin_bench_allocs(ctypes.c_long(int(n)), ctypes.c_size_t(4096))
    else:
        fn = lib.standin_bench_launches if what == "launch" else lib.standin_bench_syncs
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


def stop_agent(agent: subprocess.Popen) -> dict:
    """SIGINT, and the agent's final self-metrics (its last ``otelbpf: stats`` line)."""
    agent.send_signal(signal.SIGINT)
    _, err = agent.communicate(timeout=600)  # a backlog of stacks to unwind can take a while
    lines = [line for line in err.splitlines() if line.startswith("otelbpf: stats ")]
    return json.loads(lines[-1].split(" ", 2)[2]) if lines else {}


def exported_launches(metrics_file: Path, pid: int) -> int:
    """The last value of otelbpf.gpu.kernel.launches for ``pid`` in an OTLP JSON lines file."""
    found = 0
    for line in metrics_file.read_text().splitlines():
        for resource in json.loads(line).get("resourceMetrics", []):
            attrs = {a["key"]: a["value"] for a in resource.get("resource", {}).get("attributes", [])}
            if int(attrs.get("process.pid", {}).get("intValue", -1)) != pid:
                continue
            for scope in resource.get("scopeMetrics", []):
                for metric in scope.get("metrics", []):
                    if metric.get("name") == "otelbpf.gpu.kernel.launches":
                        for point in metric.get("sum", {}).get("dataPoints", []):
                            found = max(found, int(point.get("asInt", 0)))
    return found


def absorb(worker: subprocess.Popen, launches: int) -> None:
    """Launch ``launches`` times under the agent; the rate, the events user space saw, the exported total."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics_file = Path(tmp) / "metrics.jsonl"
        # the default: GPU profiles on, 1 launch in 128 takes a stack
        agent = start_agent(worker.pid, ("--metrics-json-file", str(metrics_file), "--metrics-interval", "1"))
        try:
            time.sleep(1.0)
            ns_per_launch = timed(worker, "launch", launches, 1)
            time.sleep(2.5)  # one more metrics collection after the loop
        finally:
            stats = stop_agent(agent)
        total = exported_launches(metrics_file, worker.pid)
    print(f"absorbed: {launches:,} launches at {1e9 / ns_per_launch:,.0f} launches/s in the traced process; "
          f"events that reached user space in all: {stats.get('otelbpf.events', 0):,}; "
          f"launches exported from the BPF total: {total:,} ({'equal' if total == launches else 'NOT equal'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--absorb", type=int, default=1_000_000, help="launches for the absorption run (0: skip it)")
    args = parser.parse_args()
    subprocess.run(["make", "-s", "-C", str(LIB.parent.parent)], check=True)
    worker = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert worker.stdout.readline().strip() == "ready"
    results = {}
    try:
        every = ("launch", "sync", "alloc")
        results["off"] = {w: timed(worker, w, args.calls, args.repeats) for w in every}
        for mode, extra, what in (
            ("traced", ("--no-gpu-profiles",), every),
            ("stacks", (), every),
            ("timed", ("--gpu-launch-time", "--no-gpu-profiles"), ("launch",)),
        ):
            agent = start_agent(worker.pid, extra)
            try:
                time.sleep(1.0)
                results[mode] = {w: timed(worker, w, args.calls, args.repeats) for w in what}
            finally:
                stop_agent(agent)
        if args.absorb:
            absorb(worker, args.absorb)
    finally:
        worker.kill()
    for what, mode, label in (
        ("launch", "traced", "cuLaunchKernel, entry-only (counted in BPF, the default)"),
        ("launch", "timed", "cuLaunchKernel, entry + return (--gpu-launch-time: counted and timed in BPF)"),
        ("sync", "traced", "cuStreamSynchronize (entry + return, one record)"),
        ("alloc", "traced", "cuMemAlloc_v2 + cuMemFree_v2 (entry + return each, two records)"),
        ("launch", "stacks", "cuLaunchKernel with GPU profiles (1 launch in 128 takes a stack)"),
        ("sync", "stacks", "cuStreamSynchronize with GPU profiles (a stack per call)"),
        ("alloc", "stacks", "cuMemAlloc_v2 + cuMemFree_v2 with GPU profiles (a stack per allocation)"),
    ):
        off, on = results["off"][what], results[mode][what]
        print(f"{label}: {off:.0f} ns/call off, {on:.0f} ns/call traced: +{on - off:.0f} ns")
    for what in ("launch", "sync", "alloc"):
        plain, stacked = results["traced"][what], results["stacks"][what]
        print(f"GPU profiles' own cost, {what}: +{stacked - plain:.0f} ns/call (stacks on vs --no-gpu-profiles)")


if __name__ == "__main__":
    main()
