#!/usr/bin/env python3
"""The tax of *attached* probes on nginx at saturation, probe group by probe group.

nginx_wrk.py's "idle" mode (the agent attached, tracing nothing nginx does)
shows what merely enabling the agent's tracepoints costs every process. This
script splits that cost: it compiles bpf/capture.c (and its probe families) exactly as the agent does
(through otelbpf.sources.ebpf, filter set to an idle process, so no event is
ever emitted), then attaches one group of its tracepoints at a time and runs
wrk at saturation, alternating with nothing attached. Two reference programs
that do nothing (``return 0``) tell the tracepoint mechanism's cost from the
programs' own work:

* ``empty-syscalls``: an empty program on 18 syscalls:sys_{enter,exit}_* tracepoints (what
  capture.c attached before it moved to the raw pair);
* ``empty-raw``: an empty program on raw_syscalls:sys_enter/sys_exit as raw tracepoints
  (one program per direction for every syscall, without the perf-buffer set-up
  that syscalls:* tracepoints do before calling BPF), what capture.c attached
  before payload capture moved onto sock:sock_{recv,send}_length;
* ``empty-sock``: an empty program on each raw tracepoint the agent attaches for
  every socket call and segment (sock_recv_length, sock_send_length,
  sk_data_ready): the floor of the "all" row, what no change to the programs'
  own work can go below.

    .venv/bin/python bench/probe_tax.py [--rounds 3] [--duration 5]
    OTELBPF_SOCK_TRACEPOINTS=classic .venv/bin/python bench/probe_tax.py ...  # sock_*_length as classic tracepoints

The sock_*_length pair is attached as the agent attaches it: raw tracepoints
(struct sock offsets from BTF) by default, classic ones where BTF lacks them
or with OTELBPF_SOCK_TRACEPOINTS=classic.

Same nginx, wrk, pinning and noise handling as nginx_wrk.py; output is a table
of median req/s and the ratio to "none".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import nginx_wrk  # noqa: E402 - its options, with their defaults
from wrkbench.console import BenchError  # noqa: E402
from wrkbench.machine import preflight  # noqa: E402
from wrkbench.processes import Children  # noqa: E402
from wrkbench.report import table  # noqa: E402
from wrkbench.runs import Bench  # noqa: E402

DATA_SYSCALLS = ("read", "write", "recvfrom", "sendto", "readv", "writev", "recvmsg", "sendmsg", "sendfile64")
UDP_SYSCALL_TRACEPOINTS = [
    "syscalls:sys_enter_sendmmsg", "syscalls:sys_enter_recvmmsg",
    "syscalls:sys_exit_recvfrom", "syscalls:sys_exit_recvmsg", "syscalls:sys_exit_recvmmsg",
]
GROUPS = {
    "all (as the agent, default)": "default",  # every tracepoint but the --udp ones
    "all with --udp": None,  # every tracepoint capture.c has
    "per-syscall tracepoints (--udp, 5)": UDP_SYSCALL_TRACEPOINTS,
    # raw or classic tracepoints, as the agent chose (OTELBPF_SOCK_TRACEPOINTS=classic forces classic)
    "sock:sock_*_length (2)": ["sock:sock_recv_length", "sock:sock_send_length"],
    "raw:sk_data_ready (1)": ["raw:sk_data_ready"],
    "inet_sock_set_state (1)": ["sock:inet_sock_set_state"],
    "lifecycle (5)": [
        "sched:sched_process_fork", "sched:sched_process_exec", "sched:sched_process_exit",
        "sock:inet_sock_set_state", "raw:sk_data_ready",
    ],
}

EMPTY_SYSCALLS = "\n".join(
    f"TRACEPOINT_PROBE(syscalls, sys_{d}_{s}) {{ return 0; }}" for s in DATA_SYSCALLS for d in ("enter", "exit")
)
EMPTY_RAW_SYSCALLS = ("sys_enter", "sys_exit")
#: the raw tracepoints capture.c attaches that fire per socket call or segment
EMPTY_RAW_SOCK = ("sock_recv_length", "sock_send_length", "sk_data_ready")


def empty_raw_programs(names: tuple[str, ...]) -> str:
    return "".join(f"RAW_TRACEPOINT_PROBE({name}) {{ return 0; }}\n" for name in names)


class Probes:
    """capture.c loaded once (as the agent loads it); groups attached on demand."""

    def __init__(self, dummy_pid: int) -> None:
        from otelbpf.sources.ebpf import CaptureConfig, EbpfSource

        self.source = EbpfSource(CaptureConfig(pids=[dummy_pid], capture_udp=True))
        self.source.start()
        self.bpf = self.source._bpf  # noqa: SLF001 - a diagnostic, not product code
        self.all = {tp: self._fn_name(tp) for tp in list(self.bpf.tracepoint_fds)}
        self.all.update({b"raw:" + tp: b"raw_tracepoint__" + tp for tp in list(self.bpf.raw_tracepoint_fds)})
        self.detach_all()

    @staticmethod
    def _fn_name(tp: bytes) -> bytes:
        category, name = tp.split(b":")
        return b"tracepoint__" + category + b"__" + name

    def _resolve(self, tp: bytes) -> bytes:
        """A group's "sock:sock_recv_length" is b"raw:sock_recv_length" when the
        agent hooks it as a raw tracepoint (socket capture with BTF offsets)."""
        if tp in self.all:
            return tp
        raw = b"raw:" + tp.split(b":")[-1]
        if raw in self.all:
            return raw
        raise KeyError(f"{tp.decode()}: not one of the agent's probes ({', '.join(t.decode() for t in self.all)})")

    def detach_all(self) -> None:
        for tp in list(self.bpf.tracepoint_fds):
            self.bpf.detach_tracepoint(tp)
        for tp in list(self.bpf.raw_tracepoint_fds):
            self.bpf.detach_raw_tracepoint(tp)

    def attach(self, group: list[str] | None) -> int:
        if group == "default":
            tps = [tp for tp in self.all if not tp.startswith(b"syscalls:")]
        else:
            tps = list(self.all) if group is None else [self._resolve(g.encode()) for g in group]
        for tp in tps:
            if tp.startswith(b"raw:"):
                self.bpf.attach_raw_tracepoint(tp=tp[4:], fn_name=self.all[tp])
            else:
                self.bpf.attach_tracepoint(tp=tp, fn_name=self.all[tp])
        return len(tps)

    def close(self) -> None:
        self.source.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=8, help="alternations (default 8: windows vary by +-15%% on a shared VM)")
    p.add_argument("--duration", type=int, default=3, help="seconds per window (default 3)")
    p.add_argument("--configs", help="comma-separated subset of: " + ", ".join(["none", *GROUPS, "empty-syscalls (18)", "empty-raw (2)", "empty-sock (3)", "otelbpf run"]) + " (prefixes work)")
    p.add_argument("--output", type=Path, help="also write the results as JSON here")
    args = p.parse_args()
    bench_args = nginx_wrk.parse_args(["--noise-retries", "2", "--quiet-wait", "20"])
    children = Children()
    workdir = Path(tempfile.mkdtemp(prefix="otelbpf-bench-tax-"))
    probes = None
    try:
        preflight(bench_args)
        from bcc import BPF

        bench = Bench(bench_args, children, workdir)
        bench.start()
        dummy = bench.dummy_pid()
        probes = Probes(dummy)
        empty_sys = BPF(text=EMPTY_SYSCALLS)  # auto-attached on load
        # name -> (program, its raw tracepoints; () for the syscalls:* ones)
        empties = {
            "empty-syscalls (18)": (empty_sys, ()),
            "empty-raw (2)": (BPF(text=empty_raw_programs(EMPTY_RAW_SYSCALLS)), EMPTY_RAW_SYSCALLS),
        }
        # sk_data_ready is Linux >= 6.6: an empty program only where the agent would attach one
        sock_tps = tuple(tp for tp in EMPTY_RAW_SOCK if Path(f"/sys/kernel/tracing/events/sock/{tp}").is_dir())
        empties[f"empty-sock ({len(sock_tps)})"] = (BPF(text=empty_raw_programs(sock_tps)), sock_tps)
        saved_syscalls = list(empty_sys.tracepoint_fds)

        def detach_empty(name: str) -> None:
            b = empties[name][0]
            for tp in list(b.tracepoint_fds):
                b.detach_tracepoint(tp)
            for tp in list(b.raw_tracepoint_fds):
                b.detach_raw_tracepoint(tp)

        def attach_empty(name: str) -> int:
            b, raw = empties[name]
            if b is empty_sys:
                for tp in saved_syscalls:
                    b.attach_tracepoint(tp=tp, fn_name=Probes._fn_name(tp))
                return len(saved_syscalls)
            for tp in raw:
                b.attach_raw_tracepoint(tp=tp.encode(), fn_name=b"raw_tracepoint__" + tp.encode())
            return len(raw)

        # start with the empty programs detached: keep them loaded, detach their attachments
        for name in empties:
            detach_empty(name)

        agent_config = "otelbpf run --pid <idle> (the agent)"
        configs = ["none", *GROUPS, *empties, agent_config]
        if args.configs:
            wanted = [w.strip() for w in args.configs.split(",") if w.strip()]
            configs = ["none"] + [c for c in configs[1:] if any(c.startswith(w) for w in wanted)]
        results: dict[str, list[float]] = {c: [] for c in configs}
        print(f"\nsocket capture: {probes.source.sock_capture.describe()}")
        print(f"\nsaturation, wrk -t{bench_args.threads} -c{bench_args.connections}, {args.rounds} rounds x {len(configs)} configs x {args.duration}s; {bench.layout.describe()}")
        for rnd in range(1, args.rounds + 1):
            for config in configs:
                agent = None
                if config in GROUPS:
                    count = probes.attach(GROUPS[config])
                elif config in empties:
                    count = attach_empty(config)
                elif config == agent_config:
                    agent = bench.agents.start(["--pid", str(dummy)], ["--json-file", str(workdir / "unused.json")])
                    count = len(probes.all)
                else:
                    count = 0
                time.sleep(0.3)
                try:
                    window = bench.measure(lambda: bench.wrk.saturate(args.duration, bench_args.threads, bench_args.connections), None, round=rnd, mode=config[:4])
                finally:
                    if config in GROUPS:
                        probes.detach_all()
                    elif config in empties:
                        detach_empty(config)
                    elif agent is not None:
                        bench.agents.stop(agent)
                results[config].append(window["_rps"])
                print(f"    ^ {config}: {count} programs attached")
        base = statistics.median(results["none"])
        rows = []
        summary = {}
        for config in configs:
            med = statistics.median(results[config])
            paired = statistics.median(r / n for r, n in zip(results[config], results["none"]))
            summary[config] = {"median_rps": round(med, 1), "ratio": round(med / base, 3), "paired_ratio": round(paired, 3), "runs": [round(r, 1) for r in results[config]]}
            rows.append([config, f"{med:,.0f}", f"{med / base:.3f}x", f"{paired:.3f}x", " ".join(f"{r / 1000:.1f}k" for r in results[config])])
        print()
        print(table(["attached", "median req/s", "vs none", "per-round", "rounds"], rows))
        print("  (vs none: ratio of medians; per-round: median of each round's ratio to that round's 'none')")
        if args.output:
            args.output.write_text(json.dumps(summary, indent=2) + "\n")
    except BenchError as exc:
        print(f"probe_tax: error: {exc}")
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        if probes is not None:
            probes.close()
        children.stop_all()
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
