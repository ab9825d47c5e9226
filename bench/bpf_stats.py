#!/usr/bin/env python3
"""Run time of the agent's BPF programs, per program: the kernel tax, measured in the kernel.

With ``kernel.bpf_stats_enabled=1`` the kernel times every run of every BPF program
(``run_time_ns``, ``run_cnt``; it costs two clock reads per run, so leave it off while
measuring throughput). The counters are read from ``/proc/PID/fdinfo/FD`` of the BPF
program fds the agent holds (``prog_id``, ``run_time_ns``, ``run_cnt``), so neither
bpftool nor the agent's internals are needed; program names come from the bpf(2) syscall
(BPF_PROG_GET_FD_BY_ID + BPF_OBJ_GET_INFO_BY_FD), as bpftool gets them.

Used by nginx_wrk.py (``--only bpf``); standalone, against any running agent::

    .venv/bin/python bench/bpf_stats.py --pid $(pgrep -f 'otelbpf run') --seconds 5 [--requests N]
    .venv/bin/python bench/bpf_stats.py --floor     # what an empty program reads as here

``--requests`` (the requests served during the window, if known) adds ns per request.
The sysctl is set for the window and put back as it was.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import sys
import time
from pathlib import Path

SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")
_BPF_SYSCALL = {"x86_64": 321, "aarch64": 280, "arm64": 280}.get(platform.machine())
BPF_PROG_GET_FD_BY_ID = 13
BPF_OBJ_GET_INFO_BY_FD = 15
_libc = ctypes.CDLL(None, use_errno=True)


def stats_enabled() -> bool:
    try:
        return SYSCTL.read_text().strip() == "1"
    except OSError:
        return False


def set_stats(on: bool) -> bool:
    """Set kernel.bpf_stats_enabled; returns the previous value."""
    before = stats_enabled()
    SYSCTL.write_text("1\n" if on else "0\n")
    return before


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(x) for x in f.read().split())
        except OSError:
            pass
    return out


def prog_fds(pid: int) -> dict[int, dict]:
    """BPF programs held by ``pid`` and its descendants: prog_id -> {run_time_ns, run_cnt, prog_type}."""
    progs: dict[int, dict] = {}
    for p in _descendants(pid):
        try:
            fds = os.listdir(f"/proc/{p}/fdinfo")
        except OSError:
            continue
        for fd in fds:
            try:
                with open(f"/proc/{p}/fdinfo/{fd}") as f:
                    text = f.read()
            except OSError:
                continue
            if "prog_id:" not in text or "run_cnt:" not in text:
                continue  # not a program (a raw tracepoint's link fd names its prog_id too)
            fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
            try:
                prog_id = int(fields["prog_id"])
            except (KeyError, ValueError):
                continue
            progs[prog_id] = {
                "prog_type": int(fields.get("prog_type", "-1")),
                "run_time_ns": int(fields.get("run_time_ns", "0")),
                "run_cnt": int(fields.get("run_cnt", "0")),
            }
    return progs


def prog_name(prog_id: int) -> str:
    """The program's name (as bpftool shows it, 15 chars at most), or 'prog <id>'."""
    if _BPF_SYSCALL is None:
        return f"prog {prog_id}"
    attr = (ctypes.c_uint32 * 3)(prog_id, 0, 0)
    fd = _libc.syscall(_BPF_SYSCALL, BPF_PROG_GET_FD_BY_ID, ctypes.byref(attr), ctypes.sizeof(attr))
    if fd < 0:
        return f"prog {prog_id}"
    try:
        info = ctypes.create_string_buffer(80)  # struct bpf_prog_info up to name[16] at offset 64
        get = (ctypes.c_uint32 * 4)()
        get[0], get[1] = fd, 80
        ctypes.c_uint64.from_buffer(get, 8).value = ctypes.addressof(info)
        if _libc.syscall(_BPF_SYSCALL, BPF_OBJ_GET_INFO_BY_FD, ctypes.byref(get), ctypes.sizeof(get)) != 0:
            return f"prog {prog_id}"
        return info.raw[64:80].split(b"\0", 1)[0].decode(errors="replace") or f"prog {prog_id}"
    finally:
        os.close(fd)


_names: dict[int, str] = {}


def snapshot(pid: int) -> dict[int, dict]:
    """prog_fds() with each program's name (resolved now, while the program exists)."""
    progs = prog_fds(pid)
    for prog_id, entry in progs.items():
        if prog_id not in _names:
            _names[prog_id] = prog_name(prog_id)
        entry["name"] = _names[prog_id]
    return progs


def delta(before: dict[int, dict], after: dict[int, dict], requests: int | None = None) -> dict:
    """Per program between two snapshots: runs, ns, ns/run, runs and ns per request; and the total."""
    rows = []
    for prog_id, b in after.items():
        a = before.get(prog_id, {"run_time_ns": 0, "run_cnt": 0})
        runs = b["run_cnt"] - a["run_cnt"]
        ns = b["run_time_ns"] - a["run_time_ns"]
        row = {"prog_id": prog_id, "name": b.get("name") or _names.get(prog_id) or prog_name(prog_id), "runs": runs, "ns": ns, "ns_per_run": round(ns / runs, 1) if runs else None}
        if requests:
            row["runs_per_request"] = round(runs / requests, 2)
            row["ns_per_request"] = round(ns / requests, 1)
        rows.append(row)
    rows.sort(key=lambda r: -r["ns"])
    total_ns = sum(r["ns"] for r in rows)
    total_runs = sum(r["runs"] for r in rows)
    out = {"programs": rows, "total_ns": total_ns, "total_runs": total_runs, "requests": requests}
    if requests:
        out["total_ns_per_request"] = round(total_ns / requests, 1)
        out["total_runs_per_request"] = round(total_runs / requests, 2)
    return out


def format_table(result: dict) -> str:
    has_req = bool(result.get("requests"))
    head = ["program", "id", "runs", "ns/run", "total ms"] + (["runs/req", "ns/req"] if has_req else [])
    rows = [head]
    for r in result["programs"]:
        row = [r["name"], str(r["prog_id"]), f"{r['runs']:,}", "-" if r["ns_per_run"] is None else f"{r['ns_per_run']:,.0f}", f"{r['ns'] / 1e6:,.1f}"]
        if has_req:
            row += [f"{r['runs_per_request']:.2f}", f"{r['ns_per_request']:,.0f}"]
        rows.append(row)
    total = ["TOTAL", "", f"{result['total_runs']:,}", "", f"{result['total_ns'] / 1e6:,.1f}"]
    if has_req:
        total += [f"{result['total_runs_per_request']:.2f}", f"{result['total_ns_per_request']:,.0f}"]
    rows.append(total)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = []
    for n, r in enumerate(rows):
        lines.append("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if n == 0 or n == len(rows) - 2:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


FLOOR_PROGRAM = r"""
RAW_TRACEPOINT_PROBE(sock_send_length) { return 0; }
"""


def measure_floor(sends: int = 200_000) -> dict:
    """What the timing itself reads as: an empty program on the raw tracepoint sock_send_length,
    run by ``sends`` one-byte writes on a Unix socket pair with bpf_stats on (the dispatch plus the
    two clock reads each run pays; a virtual machine's clock makes them dear). The agent's
    programs' ns per run minus this is their own work. Needs root and BCC."""
    import socket

    from bcc import BPF

    previous = set_stats(True)
    prog = BPF(text=FLOOR_PROGRAM)
    try:
        before = prog_fds(os.getpid())
        a, b = socket.socketpair()
        try:
            for _ in range(sends):
                a.send(b"x")
                b.recv(1)
        finally:
            a.close()
            b.close()
        result = delta(before, prog_fds(os.getpid()))
    finally:
        prog.cleanup()
        set_stats(previous)
    runs = sum(r["runs"] for r in result["programs"])
    ns = sum(r["ns"] for r in result["programs"])
    return {"runs": runs, "ns_per_run": round(ns / runs, 1) if runs else None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pid", type=int, help="the agent's pid (its descendants are included)")
    p.add_argument("--floor", action="store_true", help="measure what an empty program reads as (the timing's own cost per run) and exit")
    p.add_argument("--seconds", type=float, default=5.0, help="window length (default 5)")
    p.add_argument("--requests", type=int, help="requests served during the window, for ns per request")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("bpf_stats: run as root", file=sys.stderr)
        return 2
    if args.floor:
        floor = measure_floor()
        print(f"an empty program on sock_send_length: {floor['ns_per_run']} ns per run over {floor['runs']:,} runs "
              "(the dispatch and the timing's two clock reads: subtract it from a program's ns/run)")
        return 0
    if args.pid is None:
        p.error("--pid is required (or --floor)")
    previous = set_stats(True)
    try:
        before = snapshot(args.pid)
        if not before:
            print(f"bpf_stats: pid {args.pid} holds no BPF program fd", file=sys.stderr)
            return 2
        time.sleep(args.seconds)
        result = delta(before, snapshot(args.pid), args.requests)
    finally:
        set_stats(previous)
    print(f"BPF programs of pid {args.pid} over {args.seconds:g}s (kernel.bpf_stats_enabled=1 during the window):")
    print(format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
