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

This file is the command: its options and the order of the parts. The workload drivers and the
report are in bench/wrkbench/ (its __init__ lists the modules).
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from wrkbench import report
from wrkbench.console import BenchError, say
from wrkbench.machine import machine_info, preflight
from wrkbench.nginx import DEFAULT_PATHS
from wrkbench.processes import Children
from wrkbench.procfs import system_busy_check
from wrkbench.runs import MODES, Bench

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
        bad = [m for m in modes if m not in MODES]
        if bad or "off" not in modes:
            parser.error(f"--{name.replace('_', '-')}: modes among {', '.join(MODES)}, 'off' included (got {getattr(args, name)!r})")
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


def run_parts(bench: Bench, parts: set[str]) -> None:
    """The parts asked for, always in this order (half load halves saturation's result)."""
    if "saturation" in parts:
        bench.saturation()
    if "fixed" in parts:
        bench.fixed_rate()
    if "cost" in parts:
        bench.cost()
    if "bpf" in parts:
        bench.bpf()
    if "loss" in parts:
        bench.loss_sweep()
        report.agent_cost(bench.results)
    if "startup" in parts:
        bench.startup()


def stop_on_signals() -> None:
    """Ctrl-C, SIGTERM and SIGHUP all end the run the same way: every child stopped, no report."""
    def on_term(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored (a background job)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = dt.datetime.now(dt.timezone.utc)
    children = Children()
    stop_on_signals()
    workdir = Path(tempfile.mkdtemp(prefix="otelbpf-bench-nginx-"))
    bench = None
    code = 0
    try:
        preflight(args)
        busy = system_busy_check()
        bench = Bench(args, children, workdir)
        command = [sys.executable, *sys.argv] if argv is None else ["nginx_wrk.py", *argv]
        bench.results.update(report.run_description(args, bench.layout, bench.agent_command.describe(), machine_info(), command, started, busy))
        report.say_run_header(bench.results)
        bench.start()
        run_parts(bench, args.only)
        report.conclude(bench.results, args, bench.noise_spent)
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
        report.finish(bench.results, args, started)
    return code


if __name__ == "__main__":
    sys.exit(main())
