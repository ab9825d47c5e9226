#!/usr/bin/env python3
"""Where does the agent's CPU go? py-spy on `otelbpf run` while nginx takes a fixed rate.

Same set-up as bench/nginx_wrk.py (its nginx, wrk scheduler, pinning and agent
launcher), one run, sampled with py-spy (all threads, idle samples excluded),
then folded into a stage breakdown (each sample charged to the innermost otelbpf /
protocols frame of its stack, mapped to a pipeline stage by module) and tables of self and
inclusive time per function, converted to microseconds per request with the agent's
measured CPU time (utime+stime from /proc, load start -> caught up)::

    python3 -m venv /tmp/pyspy-venv && /tmp/pyspy-venv/bin/pip install py-spy
    .venv/bin/python bench/profile_agent.py --rate 10000 --duration 10
    .venv/bin/python bench/profile_agent.py --sink jsonfile --py-spy /tmp/pyspy-venv/bin/py-spy
    .venv/bin/python bench/profile_agent.py --repo ../otelbpf-base      # another checkout (before -> after)

py-spy is not a project dependency: point --py-spy at it (default: PATH, then
/tmp/pyspy-venv/bin/py-spy). The raw collapsed stacks are kept (--keep) for
flame graphs (e.g. speedscope, inferno).

py-spy sees Python frames only: time spent inside the Cython-compiled modules is
charged to their Python caller. ``--perf`` samples native frames with Linux perf
instead (self time per C symbol: the compiled functions show as
``__pyx_f_7otelbpf_8pipeline_...``, CPython's as ``_PyEval_EvalFrameDefault``,
``PyDict_...``)::

    .venv/bin/python bench/profile_agent.py --perf --rate 10000 --duration 8
    .venv/bin/python bench/profile_agent.py --perf --callers    # whose work the interpreter's time is
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import nginx_wrk  # noqa: E402 - its options, with their defaults
from wrkbench.console import BenchError  # noqa: E402
from wrkbench.machine import preflight  # noqa: E402
from wrkbench.processes import Children, taskset  # noqa: E402
from wrkbench.procfs import CLK_TCK, proc_cpu_ticks  # noqa: E402
from wrkbench.runs import Bench  # noqa: E402
from wrkbench.span_counting import CountingReceiver  # noqa: E402


def find_py_spy(given: str | None) -> str:
    for candidate in (given, shutil.which("py-spy"), "/tmp/pyspy-venv/bin/py-spy"):
        if candidate and Path(candidate).exists():
            return candidate
    raise BenchError("py-spy not found: python3 -m venv /tmp/pyspy-venv && /tmp/pyspy-venv/bin/pip install py-spy (or pass --py-spy)")


def fold(raw: Path) -> tuple[Counter, Counter, Counter, int]:
    """Self samples per frame, inclusive samples per frame, samples per thread, total."""
    self_c: Counter = Counter()
    incl: Counter = Counter()
    threads: Counter = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = stack.split(";")
        if frames and frames[0].startswith("thread ("):
            threads[frames[0]] += n
            frames = frames[1:]
        total += n
        if frames:
            self_c[short(frames[-1])] += n
        for frame in {short(f) for f in frames}:
            incl[frame] += n
    return self_c, incl, threads, total


#: (module path fragment, stage), first match wins; checked against the innermost project frame
STAGES = (
    ("otelbpf/sources/", "1 capture: ring-buffer read + record decode"),
    ("otelbpf/reorder", "2 reorder"),
    ("otelbpf/connections", "3 connections + protocol detection"),
    ("protocols/", "4 HTTP parsing"),
    ("otelbpf/association", "6 association (parent links)"),
    ("otelbpf/propagation", "6 association (parent links)"),
    ("otelbpf/spans", "5 span building"),
    ("otelbpf/resources", "5 span building"),
    ("otelbpf/identity", "5 span building"),
    ("otelbpf/export/", "7 export (encode + queue + send)"),
    ("otelbpf/metrics/", "8 RED metrics"),
    ("otelbpf/selfmetrics", "9 self-metrics"),
    ("otelbpf/pipeline", "0 pipeline / agent loop (own code)"),
    ("otelbpf/agent", "0 pipeline / agent loop (own code)"),
    ("otelbpf/", "0 other otelbpf code"),
)


def stage_of(stack: list[str]) -> str:
    """The stage of a sample: the innermost frame in the project's code decides; none: by library."""
    for frame in reversed(stack):
        path = frame.partition(" (")[2].rstrip(")").rsplit(":", 1)[0]
        for fragment, stage in STAGES:
            if fragment in path and "-packages/" not in path:
                return stage
    leaf = stack[-1] if stack else ""
    if "grpc" in leaf or "protobuf" in leaf:
        return "7 export (encode + queue + send)"
    return "~ outside the project's code (interpreter start, threading, libraries)"


def fold_stages(raw: Path) -> tuple[dict, int]:
    """Samples per stage (each sample once), and the total."""
    stages: Counter = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        if frames and frames[0].startswith("thread ("):
            frames = frames[1:]
        stages[stage_of(frames)] += int(count)
        total += int(count)
    return stages, total


def short(frame: str) -> str:
    """'func (path/to/module.py:123)' -> 'func (module.py)': lines merged per function."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(path).parts
    tail = "/".join(parts[-2:]) if len(parts) >= 2 else path
    return f"{name} ({tail})"


def print_perf_threads(data: Path, us_per_request: float) -> None:
    """Self time per thread: the pipeline's main thread, the export threads, gRPC's own."""
    out = subprocess.run(
        ["perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort", "pid", "--percent-limit", "0.5"],
        capture_output=True, text=True,
    ).stdout
    print("\nSELF time per thread (perf): share, us per request, thread")
    for line in out.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            share, _, thread = line.strip().partition(" ")
            value = float(share.rstrip("%")) if share.endswith("%") else None
            if value is not None:
                print(f"  {value:5.1f}%  {value * us_per_request / 100:6.2f} us  {thread.strip()}")


def print_perf_symbols(data: Path, us_per_request: float, top: int) -> None:
    """Self time per native symbol (perf report), as a share and in us per request."""
    report = subprocess.run(
        ["perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort", "dso,sym", "--percent-limit", "0.3"],
        capture_output=True, text=True, check=True,
    ).stdout
    rows = [line.split(None, 3) for line in report.splitlines() if line.strip().endswith(tuple("abcdefghijklmnopqrstuvwxyz0123456789_]")) and "%" in line and not line.startswith("#")]
    by_object = subprocess.run(
        ["perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort", "dso", "--percent-limit", "0.5"],
        capture_output=True, text=True, check=True,
    ).stdout
    print("\nSELF time per object (perf): share, us per request, object (an extension module is compiled project code)")
    for line in by_object.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0].endswith("%") and not line.startswith("#"):
            pct = float(fields[0].rstrip("%"))
            print(f"  {pct:5.1f}%  {pct / 100 * us_per_request:6.2f} us  {fields[1]}")
    print("\nSELF time per native symbol (perf): share, us per request, object, symbol")
    for share, dso, _kind, symbol in [r for r in rows if len(r) == 4][:top]:
        pct = float(share.rstrip("%"))
        print(f"  {pct:5.1f}%  {pct / 100 * us_per_request:6.2f} us  {dso:28.28s} {symbol}")


def print_perf_callers(data: Path, us_per_request: float, top: int) -> None:
    """Native time charged to the compiled project function that caused it: each sample's
    stack is walked from the leaf out to the first frame in a project extension module (time
    inside the interpreter's object machinery -- attribute look-ups, allocation, dict and
    tuple work -- done on behalf of compiled code); a stack that reaches the bytecode
    interpreter first is charged to interpreted Python, any other to its leaf's object."""
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip,sym,dso"], capture_output=True, text=True)
    charged: Counter = Counter()
    total = 0
    for block in script.stdout.split("\n\n"):
        frames = [line.strip() for line in block.splitlines() if line.strip()]
        if not frames:
            continue
        total += 1
        leaf_object = frames[0].rsplit("(", 1)[-1].rstrip(")")
        where = "other: " + Path(leaf_object).name
        for frame in frames:
            symbol, _, dso = frame.partition(" ")[2].rpartition(" (")
            dso = Path(dso.rstrip(")")).name
            if ".cpython-" in dso and ("/otelbpf/" in frame or "/protocols/" in frame):
                where = f"{dso.split('.')[0]}: {symbol.split('+')[0]}"
                break
            if symbol.startswith("_PyEval_EvalFrameDefault"):
                where = "interpreted Python (uncompiled code)"
                break
        charged[where] += 1
    print("\nCHARGED to the nearest compiled project function (perf call graphs): share, us per request")
    for where, n in charged.most_common(top):
        print(f"  {100 * n / max(1, total):5.1f}%  {n / max(1, total) * us_per_request:6.2f} us  {where}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=int, default=10000, help="fixed request rate (default 10000)")
    p.add_argument("--duration", type=int, default=10, help="seconds of load (default 10)")
    p.add_argument("--sink", choices=("otlp-grpc", "jsonfile"), default="otlp-grpc", help="OTLP/gRPC to the counting receiver, or a JSON file (default otlp-grpc)")
    p.add_argument("--repo", help="profile the agent of this checkout (see nginx_wrk.py --repo)")
    p.add_argument("--agent-python", help="interpreter for `-m otelbpf` (see nginx_wrk.py)")
    p.add_argument("--py-spy", dest="py_spy", help="py-spy binary")
    p.add_argument("--sample-rate", type=int, default=250, help="py-spy samples per second (default 250)")
    p.add_argument("--top", type=int, default=30, help="rows per table (default 30)")
    p.add_argument("--keep", type=Path, help="also write the collapsed stacks (py-spy) or perf.data (--perf) here")
    p.add_argument("--agent-arg", action="append", default=[], help="extra argument for `otelbpf run` (repeatable)")
    p.add_argument("--agent-cpus", default="server", help="server, client, any, or a CPU list (default server)")
    p.add_argument("--callers", action="store_true", help="with --perf: record call graphs and charge interpreter time to the compiled function that caused it")
    p.add_argument("--perf", action="store_true", help="sample native frames with Linux perf instead of py-spy (sees inside compiled modules)")
    args = p.parse_args()

    extra = [*(["--repo", args.repo] if args.repo else []), *(["--agent-python", args.agent_python] if args.agent_python else [])]
    bench_args = nginx_wrk.parse_args(["--agent-cpus", args.agent_cpus, *extra, *[f"--agent-arg={a}" for a in args.agent_arg]])
    children = Children()
    workdir = Path(tempfile.mkdtemp(prefix="otelbpf-bench-profile-"))
    receiver = None
    try:
        preflight(bench_args)
        py_spy = None if args.perf else find_py_spy(args.py_spy)
        bench = Bench(bench_args, children, workdir)
        bench.start()
        json_file = workdir / "spans.json"
        if args.sink == "jsonfile":
            outputs = ["--json-file", str(json_file)]
        else:
            receiver = CountingReceiver(children, bench.layout.client)
            outputs = ["--otlp-endpoint", receiver.grpc_endpoint, "--otlp-protocol", "grpc"]
        agent = bench.agents.start(bench.targets(), outputs)
        time.sleep(0.5)
        raw = workdir / "stacks.txt"
        if args.perf:
            raw = workdir / "perf.data"
            graph = ["--call-graph", "dwarf,16384"] if args.callers else []
            command = ["perf", "record", "-F", str(args.sample_rate * (2 if args.callers else 4)), *graph, "-p", str(agent.pid), "-o", str(raw), "--", "sleep", str(args.duration)]
        else:
            command = [py_spy, "record", "--pid", str(agent.pid), "--rate", str(args.sample_rate), "--duration", str(args.duration), "--threads", "--format", "raw", "--output", str(raw), "--nonblocking"]
        spy = children.start("perf" if args.perf else "py-spy", taskset(bench.layout.client, command), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        meter = bench.meter(agent)
        result = bench.wrk.fixed_rate(args.rate, args.duration, 1, bench_args.rate_connections)
        cpu = meter.stop()
        bench.agents.wait_idle(agent)
        agent_s = ((proc_cpu_ticks(agent.pid) or 0) - meter.start["agent"]) / CLK_TCK  # load start -> caught up
        _, spy_err = spy.communicate(timeout=60)
        children.forget(spy)
        stopped = bench.agents.stop(agent)
        if not raw.exists():
            raise BenchError(f"{command[0]} wrote nothing: {spy_err.decode(errors='replace')[-1500:]}")
        if args.perf:
            requests = max(1, result.requests)
            print(f"\n{result.rps:,.0f} req/s for {args.duration}s, sink {args.sink}: agent {cpu['agent_cores']:.2f} cores during the load, {agent_s:.2f} s CPU until caught up = {1e6 * agent_s / requests:.1f} us CPU per request")
            print("agent stats (with events lost, the agent fell behind and the profile is of what it kept up with): " + ", ".join(f"{k}={v}" for k, v in stopped["stats"].items()))
            if args.keep:
                shutil.copy(raw, args.keep)
            print_perf_threads(raw, 1e6 * agent_s / requests)
            print_perf_symbols(raw, 1e6 * agent_s / requests, args.top)
            if args.callers:
                print_perf_callers(raw, 1e6 * agent_s / requests, args.top)
            return 0
        if args.keep:
            shutil.copy(raw, args.keep)
        self_c, incl, threads, total = fold(raw)
        requests = max(1, result.requests)
        us_per_sample = 1e6 * agent_s / max(1, total) / requests

        print(f"\n{result.rps:,.0f} req/s for {args.duration}s, sink {args.sink}: agent {cpu['agent_cores']:.2f} cores during the load, {agent_s:.2f} s CPU until caught up = {1e6 * agent_s / requests:.1f} us CPU per request; nginx {cpu['nginx_cores']:.2f} cores")
        print(f"py-spy: {total:,} non-idle samples; agent stats: " + ", ".join(f"{k}={v}" for k, v in stopped["stats"].items()))
        stages, stage_total = fold_stages(raw)
        print("\nper stage (each sample charged to the innermost project frame): share, us per request")
        for name, n in sorted(stages.items()):
            print(f"  {100 * n / max(1, stage_total):5.1f}%  {n * us_per_sample:6.1f} us  {name}")
        print("\nper thread (share of non-idle samples):")
        for name, n in threads.most_common():
            print(f"  {100 * n / total:5.1f}%  {name}")
        for title, counter in (("SELF time (the function itself)", self_c), ("INCLUSIVE time (function and its callees)", incl)):
            print(f"\n{title}: share, us per request")
            for name, n in counter.most_common(args.top):
                print(f"  {100 * n / total:5.1f}%  {n * us_per_sample:6.1f} us  {name}")
    except BenchError as exc:
        print(f"profile_agent: error: {exc}")
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        if receiver is not None:
            receiver.stop()
        children.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
