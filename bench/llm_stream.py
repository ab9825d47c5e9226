#!/usr/bin/env python3
"""Streamed LLM responses traced by otelbpf vs not: tokens/s, spans/s, agent CPU per token.

An OpenAI-compatible streaming server (examples/openai_mock_server.py, no token
delay, so it streams as fast as it can: one SSE event per token, one write each)
and a load generator (this script with --client: C threads, each a kept-alive
connection sending streamed chat completions of --tokens tokens and reading
every chunk) run side by side, alternated rounds:

* ``off``: no agent;
* ``on``:  ``otelbpf run --pid SERVER --pid CLIENT`` exporting OTLP/gRPC to
  bench/otlp_counting_receiver.py (both sides traced: two spans per call, each
  with TTFT and chunk timing, so the agent sees every chunk as body progress).

Reported per mode (median over rounds): tokens/s and calls/s the client got,
and for ``on``: the ratio to ``off`` (the agent's cost to the server's
tokens/s), spans/s the receiver got, events lost, and the agent's CPU per
streamed token and per span (utime+stime from /proc, window start -> caught up)::

    .venv/bin/python bench/llm_stream.py                      # 3 rounds x 8 s
    .venv/bin/python bench/llm_stream.py --rounds 1 --duration 4 --tokens 50

Run as root (the agent needs it). Nothing is asserted: read the ratios.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import nginx_wrk as nw  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


# -- the load generator (a separate process: its CPU is not the agent's) --------------


def client_main(port: int, threads: int, duration: float, tokens: int) -> None:
    """Stream chat completions for ``duration`` seconds; print {"calls", "tokens", "seconds"}."""
    body = json.dumps(
        {"model": "bench-model", "messages": [{"role": "user", "content": "stream please"}], "max_tokens": tokens,
         "stream": True, "stream_options": {"include_usage": True}}
    ).encode()
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}
    totals = {"calls": 0, "tokens": 0}
    lock = threading.Lock()
    deadline = time.monotonic() + duration

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        calls = chunks = 0
        while time.monotonic() < deadline:
            conn.request("POST", "/v1/chat/completions", body, headers)
            response = conn.getresponse()
            for line in response:
                if line.startswith(b"data: {") and b'"content"' in line:
                    chunks += 1
            calls += 1
        conn.close()
        with lock:
            totals["calls"] += calls
            totals["tokens"] += chunks

    started = time.monotonic()
    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    totals["seconds"] = time.monotonic() - started
    print(json.dumps(totals), flush=True)


# -- the bench -----------------------------------------------------------------------------


def start_server(children: nw.Children) -> tuple[object, int]:
    proc = children.start(
        "openai mock", [sys.executable, str(ROOT / "examples" / "openai_mock_server.py"), "--port", "0"],
        stdout=__import__("subprocess").PIPE, text=True,
    )
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        raise nw.BenchError(f"the mock server did not start: {line!r}")
    return proc, int(line.split()[-1])


def one_window(args, children, launcher, receiver, server_pid: int, port: int, traced: bool) -> dict:
    import subprocess

    client = children.start(
        "load", [sys.executable, __file__, "--client", "--port", str(port), "--threads", str(args.threads),
                 "--duration", str(args.duration), "--tokens", str(args.tokens)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    agent = None
    result: dict = {"mode": "on" if traced else "off"}
    if traced:
        receiver.reset()
        agent = launcher.start(["--pid", str(server_pid), "--pid", str(client.pid)], ["--otlp-endpoint", receiver.grpc_endpoint, "--otlp-protocol", "grpc"])
    agent_start = nw.proc_cpu_ticks(agent.pid) if agent else None
    out, _ = client.communicate("go\n", timeout=args.duration + 60)  # starts once the agent is attached
    children.forget(client)
    load = json.loads(out.strip().splitlines()[-1])
    result.update(load)
    result["tokens_per_s"] = load["tokens"] / load["seconds"]
    result["calls_per_s"] = load["calls"] / load["seconds"]
    if agent is not None:
        launcher.wait_idle(agent)
        agent_s = ((nw.proc_cpu_ticks(agent.pid) or 0) - (agent_start or 0)) / nw.CLK_TCK
        stopped = launcher.stop(agent)
        counts = receiver.counts()
        spans = counts["server_spans"] + counts["other_spans"]
        result.update(
            spans=spans,
            spans_per_s=spans / load["seconds"],
            spans_per_call=spans / max(1, load["calls"]),
            events_lost=nw.stat(stopped["stats"], "otelbpf.events.lost"),
            agent_us_per_token=1e6 * agent_s / max(1, load["tokens"]),
            agent_us_per_span=1e6 * agent_s / max(1, spans),
        )
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=8.0, help="seconds of load per window (default 8)")
    p.add_argument("--threads", type=int, default=4, help="concurrent streams (default 4)")
    p.add_argument("--tokens", type=int, default=200, help="tokens per streamed response (default 200)")
    p.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client:
        sys.stdin.readline()  # the bench says go (after attaching the agent to this process)
        client_main(args.port, args.threads, args.duration, args.tokens)
        return 0

    children = nw.Children()
    receiver = None
    try:
        _server, port = start_server(children)
        receiver = nw.CountingReceiver(children, None)
        launcher = nw.AgentLauncher(children, None, [])
        windows = []
        for r in range(args.rounds):
            for traced in (False, True):
                w = one_window(args, children, launcher, receiver, _server.pid, port, traced)
                windows.append(w)
                extra = (f", {w['spans_per_s']:,.0f} spans/s, agent {w['agent_us_per_token']:.1f} us/token, lost {w['events_lost']}"
                         if traced else "")
                print(f"round {r + 1} {w['mode']:3s}: {w['tokens_per_s']:,.0f} tokens/s, {w['calls_per_s']:,.1f} calls/s{extra}", flush=True)
        off = statistics.median(w["tokens_per_s"] for w in windows if w["mode"] == "off")
        on = [w for w in windows if w["mode"] == "on"]
        med = lambda key: statistics.median(w[key] for w in on)  # noqa: E731
        print(f"\n{args.threads} streams x {args.tokens} tokens, {args.rounds} rounds of {args.duration:.0f} s (medians)")
        print(f"  tokens/s            off {off:,.0f}   on {med('tokens_per_s'):,.0f}   ratio on/off {med('tokens_per_s') / off:.3f}")
        print(f"  spans/s (on)        {med('spans_per_s'):,.1f}  ({med('spans_per_call'):.2f} per call: client + server)")
        print(f"  agent CPU           {med('agent_us_per_token'):.1f} us per streamed token, {med('agent_us_per_span'):.0f} us per span")
        print(f"  events lost (on)    {sum(w['events_lost'] for w in on)}")
    except nw.BenchError as exc:
        print(f"llm_stream: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        if receiver is not None:
            receiver.stop()
        children.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
