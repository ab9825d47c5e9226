#!/usr/bin/env python3
"""Where does the agent's CPU go? py-spy on `otelbpf run` while nginx takes a fixed rate.

Same set-up as bench/nginx_wrk.py (its nginx, wrk scheduler, pinning and agent
launcher), one run, sampled with py-spy (all threads, idle samples excluded),
then folded into a table of self and inclusive time per function, converted to
microseconds per request with the agent's measured CPU time::

    python3 -m venv /tmp/pyspy-venv && /tmp/pyspy-venv/bin/pip install py-spy
    .venv/bin/python bench/profile_agent.py --rate 10000 --duration 10
    .venv/bin/python bench/profile_agent.py --sink otlp-grpc --py-spy /tmp/pyspy-venv/bin/py-spy

py-spy is not a project dependency: point --py-spy at it (default: PATH, then
/tmp/pyspy-venv/bin/py-spy). The raw collapsed stacks are kept (--keep) for
flame graphs (e.g. speedscope, inferno).
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

import nginx_wrk as nw  # noqa: E402


def find_py_spy(given: str | None) -> str:
    for candidate in (given, shutil.which("py-spy"), "/tmp/pyspy-venv/bin/py-spy"):
        if candidate and Path(candidate).exists():
            return candidate
    raise nw.BenchError("py-spy not found: python3 -m venv /tmp/pyspy-venv && /tmp/pyspy-venv/bin/pip install py-spy (or pass --py-spy)")


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


def short(frame: str) -> str:
    """'func (path/to/module.py:123)' -> 'func (module.py)': lines merged per function."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(path).parts
    tail = "/".join(parts[-2:]) if len(parts) >= 2 else path
    return f"{name} ({tail})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=int, default=10000, help="fixed request rate (default 10000)")
    p.add_argument("--duration", type=int, default=10, help="seconds of load (default 10)")
    p.add_argument("--sink", choices=("jsonfile", "otlp-grpc"), default="jsonfile")
    p.add_argument("--py-spy", dest="py_spy", help="py-spy binary")
    p.add_argument("--sample-rate", type=int, default=250, help="py-spy samples per second (default 250)")
    p.add_argument("--top", type=int, default=30, help="rows per table (default 30)")
    p.add_argument("--keep", type=Path, help="also write the collapsed stacks here")
    p.add_argument("--agent-arg", action="append", default=[], help="extra argument for `otelbpf run` (repeatable)")
    p.add_argument("--agent-cpus", default="server", help="server, client, any, or a CPU list (default server)")
    args = p.parse_args()

    bench_args = nw.parse_args(["--agent-cpus", args.agent_cpus, *[f"--agent-arg={a}" for a in args.agent_arg]])
    children = nw.Children()
    workdir = Path(tempfile.mkdtemp(prefix="otelbpf-bench-profile-"))
    receiver = None
    try:
        nw.preflight(bench_args)
        py_spy = find_py_spy(args.py_spy)
        bench = nw.Bench(bench_args, children, workdir)
        bench.start()
        json_file = workdir / "spans.json"
        if args.sink == "jsonfile":
            outputs = ["--json-file", str(json_file)]
        else:
            receiver = nw.CountingReceiver(children, bench.layout.client)
            outputs = ["--otlp-endpoint", receiver.grpc_endpoint, "--otlp-protocol", "grpc"]
        agent = bench.agents.start(bench.targets(), outputs)
        time.sleep(0.5)
        raw = workdir / "stacks.txt"
        spy = children.start(
            "py-spy",
            nw.taskset(bench.layout.client, [py_spy, "record", "--pid", str(agent.pid), "--rate", str(args.sample_rate), "--duration", str(args.duration), "--threads", "--format", "raw", "--output", str(raw), "--nonblocking"]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        meter = bench.meter(agent)
        result = bench.wrk.fixed_rate(args.rate, args.duration, 1, bench_args.rate_connections)
        cpu = meter.stop()
        _, spy_err = spy.communicate(timeout=60)
        children.forget(spy)
        stopped = bench.agents.stop(agent)
        if not raw.exists():
            raise nw.BenchError(f"py-spy wrote nothing: {spy_err.decode(errors='replace')[-1500:]}")
        if args.keep:
            shutil.copy(raw, args.keep)
        self_c, incl, threads, total = fold(raw)
        requests = max(1, result.requests)
        agent_s = cpu["agent_cpu_s"]
        us_per_sample = 1e6 * agent_s / max(1, total) / requests

        print(f"\n{result.rps:,.0f} req/s for {args.duration}s, sink {args.sink}: agent {cpu['agent_cores']:.2f} cores = {1e6 * agent_s / requests:.1f} us CPU per request; nginx {cpu['nginx_cores']:.2f} cores")
        print(f"py-spy: {total:,} non-idle samples; agent stats: " + ", ".join(f"{k}={v}" for k, v in stopped["stats"].items()))
        print("\nper thread (share of non-idle samples):")
        for name, n in threads.most_common():
            print(f"  {100 * n / total:5.1f}%  {name}")
        for title, counter in (("SELF time (the function itself)", self_c), ("INCLUSIVE time (function and its callees)", incl)):
            print(f"\n{title}: share, us per request")
            for name, n in counter.most_common(args.top):
                print(f"  {100 * n / total:5.1f}%  {n * us_per_sample:6.1f} us  {name}")
    except nw.BenchError as exc:
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
