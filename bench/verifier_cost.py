#!/usr/bin/env python3
"""What the socket programs cost the verifier, per MAX_IOV and capture size.

Builds and loads the agent's eBPF program as ``otelbpf run`` does (raw or classic
socket tracepoints, whichever this host gets), with ``-DMAX_IOV=N`` and
``--capture-bytes`` varied, and prints, per loaded program, the instructions the
verifier processed (``verified_insns`` in /proc/self/fdinfo, Linux >= 5.16; the
kernel's limit is 1,000,000 per program) and its locked memory, or the load
error; with ``--untraced-sends N``, the send program's ns per run while this
process, which the agent does not trace (it traces an idle ``sleep``), sends. ``OTELBPF_SOCK_TRACEPOINTS=classic`` measures the classic tracepoints' programs.
Run as root; a few seconds per configuration::

    .venv/bin/python bench/verifier_cost.py --max-iov 16 24 32 --capture-bytes 4096 8192
    .venv/bin/python bench/verifier_cost.py --untraced-sends 200000
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import bcc

from otelbpf.sources.ebpf import CaptureConfig, EbpfSource

WATCHED = ("sock_send_length", "sock_recv_length", "sys_exit_recv")


def fdinfo(fd: int) -> dict[str, str]:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        return dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)


STATS = Path("/proc/sys/kernel/bpf_stats_enabled")


def untraced_cost(fd: int, sends: int) -> str:
    """ns per run of the program ``fd`` while this untraced process sends ``sends``
    datagrams on loopback (kernel.bpf_stats_enabled for the window, then put back)."""
    before = STATS.read_text()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.connect(sock.getsockname())
    try:
        STATS.write_text("1\n")
        first = fdinfo(fd)
        for _ in range(sends):
            sock.send(b"x" * 64)
            sock.recv(64)
        last = fdinfo(fd)
    finally:
        STATS.write_text(before)
        sock.close()
    runs = int(last["run_cnt"]) - int(first["run_cnt"])
    spent = int(last["run_time_ns"]) - int(first["run_time_ns"])
    return f"untraced sends: {runs} runs, {spent / max(runs, 1):.1f} ns per run"


def measure(max_iov: int | None, capture_bytes: int, udp: bool = False, sends: int = 0) -> list[str]:
    real_bpf = bcc.BPF

    class WithMaxIov(real_bpf):
        def __init__(self, *args, **kwargs):
            if max_iov is not None:
                kwargs["cflags"] = list(kwargs.get("cflags", [])) + [f"-DMAX_IOV={max_iov}"]
            super().__init__(*args, **kwargs)

    bcc.BPF = WithMaxIov
    idle = subprocess.Popen(["sleep", "600"])  # the one traced process: this one is not
    source = EbpfSource(CaptureConfig(pids=[idle.pid], capture_bytes=capture_bytes, capture_tls=False, capture_udp=udp))
    began = time.monotonic()
    try:
        source.start()
    except Exception as exc:  # noqa: BLE001 - report the verifier's verdict, go on
        tail = [line for line in str(exc).splitlines() if re.search(r"processed|too (large|complex)|limit", line)]
        idle.kill()
        return [f"MAX_IOV={max_iov} capture={capture_bytes}: load failed: {' | '.join(tail[-2:]) or str(exc)[-200:]}"]
    finally:
        bcc.BPF = real_bpf
    out = [f"MAX_IOV={max_iov} capture={capture_bytes}: start (compile, load, attach) {time.monotonic() - began:.2f}s"]
    try:
        for name, func in sorted(source._bpf.funcs.items()):
            name = name.decode() if isinstance(name, bytes) else name
            if not any(w in name for w in WATCHED):
                continue
            info = fdinfo(func.fd)
            line = (
                f"MAX_IOV={max_iov} capture={capture_bytes} {name}: verified_insns={info.get('verified_insns', '?').strip()}"
                f" memlock={info.get('memlock', '?').strip()}B"
            )
            if sends and "send_length" in name:
                line += "; " + untraced_cost(func.fd, sends)
            out.append(line)
    finally:
        source.close()
        idle.kill()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-iov", type=int, nargs="+", default=[None], help="override MAX_IOV (default: bpf/common.h's)")
    parser.add_argument("--capture-bytes", type=int, nargs="+", default=[4096])
    parser.add_argument("--udp", action="store_true", help="with UDP capture (its syscall-exit programs gather too)")
    parser.add_argument("--untraced-sends", type=int, default=0, metavar="N",
                        help="also time the send program over N sends of this untraced process")
    args = parser.parse_args()
    for max_iov in args.max_iov:
        for capture in args.capture_bytes:
            for line in measure(max_iov, capture, args.udp, args.untraced_sends):
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
