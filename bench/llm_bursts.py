#!/usr/bin/env python3
"""What whole capture costs on bursty LLM streams: BPF ns and agent us per request, whole vs prefix.

The bundled mock (examples/openai_mock_server.py) streams chat completions as real
engines do, many SSE events per write (``--burst-events``, 50 by default: ~16 KB
writes with 120-byte tokens), as fast as it can; a load generator (this script with
--client: T threads, each a kept-alive httpx connection reading 64 KiB per receive, as
the openai SDK does) streams calls of --tokens tokens. Alternated windows:

* ``off``:    no agent;
* ``whole``:  ``otelbpf run --pid SERVER --pid CLIENT`` as shipped: the connections of
  LLM calls are captured whole (bpf/capture.h; up to 256 KiB a call, in pieces);
* ``prefix``: the same with OTELBPF_WHOLE_CAPTURE=off: the first --capture-bytes of
  each read and write only (the usage chunk of a burst read is lost, and gaps).

Both sides are traced; spans go over OTLP/gRPC to bench/otlp_counting_receiver.py. The
load is paced (``--rate`` calls a second per stream), so every window carries the same
calls and the per-call costs compare; ``--rate 0`` runs back to back (a throughput test:
whole capture puts ~4x the bytes in the ring, and an agent that falls behind drops
records, counted).
Reported per mode (medians over rounds): calls/s and the ratio to ``off``; the BPF
programs' ns per call (kernel.bpf_stats_enabled=1 during the traced windows, so the
traced windows' throughput includes its two clock reads per program run, alike for
both); the agent's CPU (utime+stime, window start to caught up) per call; ring
records (``otelbpf.events``) and records cut short (``otelbpf.payload.truncated``) per
call; usage filled from the peer; and whole / prefix side by side::

    .venv/bin/python bench/llm_bursts.py                       # 3 rounds x 6 s, bursts of 50
    .venv/bin/python bench/llm_bursts.py --burst-events 0      # every call's tokens in one write
    .venv/bin/python bench/llm_bursts.py --gather              # bursts written with sendmsg, a buffer per event

``--kernel`` measures the probes alone, without the noise of a server, a client and an
agent sharing the CPUs: this process traces itself and sends bursts (16, 64 and 240 KB,
with write and with sendmsg of 50 buffers) on a connection marked for whole capture and
on one that is not, and reports the BPF ns per call (the send's program and its reads')::

    .venv/bin/python bench/llm_bursts.py --kernel [--rounds 5]

Run as root (the agent needs it). Nothing is asserted: read the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bpf_stats  # noqa: E402
import llm_stream  # noqa: E402
from llm_stream import run_workers  # noqa: E402
from wrkbench.agent import AgentLauncher, stat  # noqa: E402
from wrkbench.console import BenchError  # noqa: E402
from wrkbench.processes import Children  # noqa: E402
from wrkbench.procfs import CLK_TCK, proc_cpu_ticks  # noqa: E402
from wrkbench.span_counting import CountingReceiver  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODES = ("off", "whole", "prefix")


# -- the load generator (a separate process: its CPU is not the agent's) ---------------------


def client_main(port: int, threads: int, duration: float, tokens: int, token_bytes: int, rate: float) -> None:
    """Stream chat completions for ``duration`` seconds through httpx (64 KiB receives),
    each thread ``rate`` calls a second (0: back to back); print {"calls", "bytes", "seconds"}."""
    import httpx

    body = {"model": "bench-model", "messages": [{"role": "user", "content": "stream please"}], "max_tokens": tokens,
            "stream": True, "stream_options": {"include_usage": True}, "mock_token_bytes": token_bytes}  # fmt: skip
    totals = {"calls": 0, "bytes": 0}
    lock = threading.Lock()
    deadline = time.monotonic() + duration

    def worker() -> None:
        calls = received = 0
        due = time.monotonic()
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            while time.monotonic() < deadline:
                with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    for piece in response.iter_raw():
                        received += len(piece)
                calls += 1
                if rate:
                    due += 1.0 / rate
                    time.sleep(max(0.0, due - time.monotonic()))
        with lock:
            totals["calls"] += calls
            totals["bytes"] += received

    run_workers(worker, threads, totals)


# -- --kernel: the probes alone, in this process -------------------------------------------------


def kernel_main(args) -> int:
    """The socket programs' ns per call on a connection marked for whole capture and on one
    that is not, alternated: this process traces itself (an in-process EbpfSource, the
    records consumed and dropped by a thread), no agent, no server."""
    import os
    import socket

    from otelbpf.sources.ebpf import CaptureConfig, EbpfSource

    if os.geteuid() != 0:
        print("llm_bursts: run as root", file=sys.stderr)
        return 2
    source = EbpfSource(CaptureConfig(pids=[os.getpid()], python_tasks=False, capture_tls=False, capture_gpu=False))
    source.start()
    listener = socket.create_server(("127.0.0.1", 0))
    pairs = {}
    for name in ("whole", "prefix"):
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        pairs[name] = (client, server)
    listener.close()
    for client, server in pairs.values():
        client.send(b"x")
        server.recv(1)
    time.sleep(0.1)
    for event in source.read():  # mark both ends of one connection, as the agent does on an LLM call
        fds = {s.fileno() for s in pairs["whole"]}
        if getattr(event, "fd", None) in fds and getattr(event, "conn_id", 0):
            source.capture_whole(os.getpid(), event.fd, event.conn_id)
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            source.discard()
            time.sleep(0.001)

    def sink(sock: socket.socket) -> None:
        buffer = bytearray(1 << 20)
        while sock.recv_into(buffer):
            pass

    threads = [threading.Thread(target=drain, daemon=True)]
    threads += [threading.Thread(target=sink, args=(server,), daemon=True) for _, server in pairs.values()]
    for t in threads:
        t.start()
    previous = bpf_stats.set_stats(True)
    rows: dict[tuple[str, int, str], list[float]] = {}
    sizes = [16_000, 64_000, 240_000]
    try:
        for _ in range(args.rounds):
            for kind in ("write", "sendmsg"):
                for size in sizes:
                    payload = b"x" * size
                    parts = [payload[i : i + size // 50] for i in range(0, size, size // 50)]  # a buffer per event
                    calls = max(50, 8_000_000 // size)
                    for name in ("whole", "prefix"):
                        client = pairs[name][0]
                        before = bpf_stats.prog_fds(os.getpid())
                        for _ in range(calls):
                            if kind == "write":
                                client.sendall(payload)
                            else:
                                client.sendmsg(parts)
                        time.sleep(0.05)  # the receiver's last reads
                        result = bpf_stats.delta(before, bpf_stats.prog_fds(os.getpid()), calls)
                        rows.setdefault((kind, size, name), []).append(result["total_ns"] / calls)
                        time.sleep(0.05)
        lost = source.kernel_stats()["lost"]
    finally:
        bpf_stats.set_stats(previous)
        stop.set()
        for client, server in pairs.values():
            client.close()
        for t in threads[1:]:
            t.join(2)
        threads[0].join(2)
        for _, server in pairs.values():
            server.close()
        source.close()
    print(f"BPF ns per call (the send and the reads it took, both ends traced), medians of {args.rounds} rounds; "
          f"records lost {lost}")
    print(f"  {'call':24s} {'whole':>10s} {'prefix':>10s} {'whole/prefix':>13s} {'whole - prefix, ns/KiB':>24s}")
    for kind in ("write", "sendmsg"):
        for size in sizes:
            whole = statistics.median(rows[(kind, size, "whole")])
            prefix = statistics.median(rows[(kind, size, "prefix")])
            label = f"{kind} {size // 1000} KB" + (" (50 bufs)" if kind == "sendmsg" else "")
            print(f"  {label:24s} {whole:>10,.0f} {prefix:>10,.0f} {whole / prefix:>13.2f} "
                  f"{(whole - prefix) / (size / 1024):>24,.0f}")
    return 0


# -- the bench ----------------------------------------------------------------------------------


def start_server(children: Children, args) -> tuple[subprocess.Popen, int]:
    """The mock writing ``--burst-events`` SSE events per write (per sendmsg with --gather)."""
    return llm_stream.start_server(children, ["--burst-events", str(args.burst_events)] + (["--gather"] if args.gather else []))


def one_window(args, children, launcher, receiver, server_pid: int, port: int, mode: str) -> dict:
    client = children.start(
        "load", [sys.executable, __file__, "--client", "--port", str(port), "--threads", str(args.threads),
                 "--duration", str(args.duration), "--tokens", str(args.tokens), "--token-bytes", str(args.token_bytes),
                 "--rate", str(args.rate)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    result: dict = {"mode": mode}
    agent = None
    if mode != "off":
        receiver.reset()
        launcher.env["OTELBPF_WHOLE_CAPTURE"] = "on" if mode == "whole" else "off"
        agent = launcher.start(["--pid", str(server_pid), "--pid", str(client.pid)],
                               ["--otlp-endpoint", receiver.grpc_endpoint, "--otlp-protocol", "grpc"])  # fmt: skip
        bpf_before = bpf_stats.snapshot(agent.pid)
        agent_start = proc_cpu_ticks(agent.pid) or 0
    out, _ = client.communicate("go\n", timeout=args.duration + 60)  # starts once the agent is attached
    children.forget(client)
    load = json.loads(out.strip().splitlines()[-1])
    result.update(load, calls_per_s=load["calls"] / load["seconds"], bytes_per_call=load["bytes"] / max(1, load["calls"]))
    if agent is not None:
        bpf = bpf_stats.delta(bpf_before, bpf_stats.snapshot(agent.pid), load["calls"])  # before the drain: the load's
        if not bpf_stats.stats_enabled():  # someone else put the sysctl back during the window: no figure
            bpf_stats.set_stats(True)
            bpf = None
        launcher.wait_idle(agent)
        agent_s = ((proc_cpu_ticks(agent.pid) or 0) - agent_start) / CLK_TCK
        stopped = launcher.stop(agent)
        stats = stopped["stats"]
        calls = max(1, load["calls"])
        counts = receiver.counts()
        if bpf is not None:
            result.update(bpf_ns_per_call=bpf["total_ns"] / calls,
                          bpf_top=[(p["name"], round(p["ns"] / calls)) for p in bpf["programs"][:4]])
        result.update(
            agent_us_per_call=1e6 * agent_s / calls,
            events_per_call=stat(stats, "otelbpf.events") / calls,
            truncated_per_call=stat(stats, "otelbpf.payload.truncated") / calls,
            peer_filled=stat(stats, "otelbpf.genai.usage.peer_filled"),
            events_lost=stat(stats, "otelbpf.events.lost"),
            spans_per_call=(counts["server_spans"] + counts["other_spans"]) / calls,
        )
    return result


def report(args, windows: list[dict]) -> None:
    def med(mode: str, key: str):
        values = [w[key] for w in windows if w["mode"] == mode and key in w]
        return statistics.median(values) if values else None

    off = med("off", "calls_per_s")
    pace = f"{args.rate:g} calls/s each" if args.rate else "back to back"
    print(f"\nbursts of {args.burst_events or 'all'} events ({args.tokens} tokens of {args.token_bytes} B, "
          f"{'sendmsg, a buffer per event' if args.gather else 'one write each'}), {args.threads} streams ({pace}), "
          f"{args.rounds} rounds of {args.duration:g} s, medians; both sides traced, --capture-bytes default")  # fmt: skip
    rows = [
        ("calls/s", "calls_per_s", "{:,.1f}"),
        ("BPF ns per call", "bpf_ns_per_call", "{:,.0f}"),
        ("agent us per call", "agent_us_per_call", "{:,.0f}"),
        ("ring records per call", "events_per_call", "{:,.1f}"),
        ("truncated records per call", "truncated_per_call", "{:,.2f}"),
        ("spans per call", "spans_per_call", "{:,.2f}"),
    ]
    print(f"  {'':28s} {'off':>10s} {'whole':>10s} {'prefix':>10s} {'whole/prefix':>13s}")
    for label, key, spec in rows:
        cells = [med(mode, key) for mode in MODES]
        text = [spec.format(c) if c is not None else "-" for c in cells]
        ratio = f"{cells[1] / cells[2]:.2f}" if cells[1] is not None and cells[2] else "-"
        print(f"  {label:28s} {text[0]:>10s} {text[1]:>10s} {text[2]:>10s} {ratio:>13s}")
    for mode in ("whole", "prefix"):
        on = med(mode, "calls_per_s")
        lost = sum(w.get("events_lost", 0) for w in windows if w["mode"] == mode)
        peer = sum(w.get("peer_filled", 0) for w in windows if w["mode"] == mode)
        ratio = f"{on / off:.3f}" if on and off else "-"
        print(f"  {mode:6s}: calls/s {ratio} x off; events lost {lost}; usage filled from the peer {peer}")
    for mode in ("whole", "prefix"):
        top = [w["bpf_top"] for w in windows if w["mode"] == mode]
        if top:
            print(f"  BPF ns per call, top programs ({mode}, last round): {', '.join(f'{n} {ns:,}' for n, ns in top[-1])}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=6.0, help="seconds of load per window (default 6)")
    p.add_argument("--threads", type=int, default=2, help="concurrent streams (default 2)")
    p.add_argument("--tokens", type=int, default=200, help="tokens per streamed response (default 200)")
    p.add_argument("--token-bytes", type=int, default=120, help="bytes per token (the mock pads them; default 120)")
    p.add_argument("--rate", type=float, default=15.0,
                   help="calls per second per stream (default 15: the same load in every window, which the agent at "
                        "nice 10 keeps up with; 0: back to back, a throughput test)")
    p.add_argument("--burst-events", type=int, default=50, help="SSE events per server write (0: all; default 50)")
    p.add_argument("--gather", action="store_true", help="the server writes each burst with sendmsg, a buffer per event")
    p.add_argument("--agent-args", default="--no-profiles",
                   help="extra arguments for `otelbpf run` (default --no-profiles: the samples of the busy traced "
                        "threads would be charged to the agent)")
    p.add_argument("--kernel", action="store_true",
                   help="the probes alone: this process traces itself and sends bursts on a marked and an unmarked "
                        "connection (BPF ns per call; no agent, no server)")
    p.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client:
        sys.stdin.readline()  # the bench says go (after attaching the agent to this process)
        client_main(args.port, args.threads, args.duration, args.tokens, args.token_bytes, args.rate)
        return 0
    if args.kernel:
        return kernel_main(args)

    children = Children()
    receiver = None
    previous_stats = bpf_stats.set_stats(True)
    try:
        server, port = start_server(children, args)
        receiver = CountingReceiver(children, None)
        launcher = AgentLauncher(children, None, args.agent_args.split())
        windows = []
        for r in range(args.rounds):
            for mode in MODES:
                w = one_window(args, children, launcher, receiver, server.pid, port, mode)
                windows.append(w)
                extra = (f", BPF {w.get('bpf_ns_per_call', float('nan')):,.0f} ns/call, agent {w['agent_us_per_call']:,.0f} us/call, "
                         f"{w['events_per_call']:.1f} records/call, lost {w['events_lost']}" if mode != "off" else "")
                print(f"round {r + 1} {mode:6s}: {w['calls_per_s']:,.1f} calls/s, {w['bytes_per_call'] / 1024:,.0f} KiB/call{extra}",
                      flush=True)  # fmt: skip
        report(args, windows)
    except BenchError as exc:
        print(f"llm_bursts: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        bpf_stats.set_stats(previous_stats)
        if receiver is not None:
            receiver.stop()
        children.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
