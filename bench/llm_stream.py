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
tokens/s), spans/s the receiver got, events lost, and the agent's CPU
(utime+stime from /proc, window start -> caught up) per streamed token (both
sides together), per SSE chunk per traced side (a call streams its tokens plus
a role, a finish, a usage and a ``[DONE]`` chunk; each side sees every one) and
per span::

    .venv/bin/python bench/llm_stream.py                      # 3 rounds x 8 s
    .venv/bin/python bench/llm_stream.py --rounds 1 --duration 4 --tokens 50
    .venv/bin/python bench/llm_stream.py --repo ../base       # another checkout's agent (before -> after)

Run as root (the agent needs it). Nothing is asserted: read the ratios.

``--in-process`` needs neither root nor eBPF: the same calls' events (both
sides, written as the mock server writes them: one record per chunk on the
server; the client reading 4 KiB at a time) go through the agent's pipeline in
this process, handled in drains of 10 ms of their time, and it reports CPU
microseconds per SSE chunk per side (process time, best and median of
``--rounds``), with the HTTP/1 parser's SSE taps (otelbpf/semantics/genai.py) on
and off::

    .venv/bin/python bench/llm_stream.py --in-process [--calls 400] [--tokens 200] [--rounds 5]
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

from wrkbench.agent import AgentCommand, AgentLauncher, stat  # noqa: E402
from wrkbench.console import BenchError  # noqa: E402
from wrkbench.processes import Children  # noqa: E402
from wrkbench.procfs import CLK_TCK, proc_cpu_ticks  # noqa: E402
from wrkbench.span_counting import CountingReceiver  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


# -- the load generator (a separate process: its CPU is not the agent's) --------------


def client_main(port: int, threads: int, duration: float, tokens: int) -> None:
    """Stream chat completions for ``duration`` seconds; print {"calls", "tokens", "seconds"}."""
    body = json.dumps(
        {"model": "bench-model", "messages": [{"role": "user", "content": "stream please"}], "max_tokens": tokens,
         "stream": True, "stream_options": {"include_usage": True}}
    ).encode()
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}
    totals = {"calls": 0, "tokens": 0, "events": 0}  # tokens: content chunks; events: every SSE chunk
    lock = threading.Lock()
    deadline = time.monotonic() + duration

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        calls = chunks = events = 0
        while time.monotonic() < deadline:
            conn.request("POST", "/v1/chat/completions", body, headers)
            response = conn.getresponse()
            for line in response:
                if line.startswith(b"data: "):
                    events += 1  # every SSE chunk (one event each)
                    if line.startswith(b"data: {") and b'"content"' in line:
                        chunks += 1
            calls += 1
        conn.close()
        with lock:
            totals["calls"] += calls
            totals["tokens"] += chunks
            totals["events"] += events

    run_workers(worker, threads, totals)


def run_workers(worker, threads: int, totals: dict) -> None:
    """Run ``threads`` copies of ``worker`` to their end, then print ``totals`` (which the
    workers filled) as one JSON line with the seconds they took: a load generator's report."""
    started = time.monotonic()
    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    totals["seconds"] = time.monotonic() - started
    print(json.dumps(totals), flush=True)


# -- in process: the agent's pipeline fed the events of both sides -----------------------------

SERVER_PID, CLIENT_PID = 4242, 4343
TOKEN_INTERVAL_NS = 225_000  # one chunk per stream every 225 us: 4 streams at ~17.7k tokens/s, as measured live
CLIENT_READ = 4096  # the client's reads (http.client's buffered reader): 4 KiB, ~20 chunks each
DRAIN_NS = 10_000_000  # the agent drains its ring every 10 ms


def call_bytes(number: int, tokens: int) -> tuple[bytes, bytes, list[bytes]]:
    """(request head, request body, [response head, chunk, chunk, ...]) of one streamed chat
    completion, as bench/llm_stream.py's client sends it and examples/openai_mock_server.py
    answers it (json.dumps' separators, one HTTP chunk per SSE event)."""
    body = json.dumps(
        {"model": "bench-model", "messages": [{"role": "user", "content": "stream please"}], "max_tokens": tokens,
         "stream": True, "stream_options": {"include_usage": True}}
    ).encode()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nAccept-Encoding: identity\r\n"
            b"Content-Length: %d\r\nContent-Type: application/json\r\nAuthorization: Bearer sk-bench\r\n\r\n" % len(body))
    response = [b"HTTP/1.1 200 OK\r\nServer: BaseHTTP/0.6 Python/3.11.2\r\nDate: Thu, 26 Nov 2026 13:05:26 GMT\r\n"
                b"Content-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"]
    base = {"id": f"chatcmpl-mock-{number}", "object": "chat.completion.chunk", "created": 1700000000,
            "model": "bench-model-mock"}
    payloads = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    payloads += [{**base, "choices": [{"index": 0, "delta": {"content": f"tok{i} "}, "finish_reason": None}]}
                 for i in range(tokens)]
    payloads.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    payloads.append({**base, "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": tokens, "total_tokens": tokens + 2}})
    events = [f"data: {json.dumps(p)}\n\n".encode() for p in payloads] + [b"data: [DONE]\n\n"]
    response += [b"%x\r\n%s\r\n" % (len(e), e) for e in events]
    response[-1] += b"0\r\n\r\n"
    return head, body, response


def in_process_events(calls: int, tokens: int, streams: int) -> tuple[list, int]:
    """Both sides' events for ``calls`` calls over ``streams`` kept-alive connections, in time
    order, and the number of SSE chunks per side."""
    from otelbpf.core.events import ConnOpen, DataEvent, RoleHint
    from protocols.base import Direction

    ingress, egress = Direction.INGRESS, Direction.EGRESS
    start = 1_700_000_000_000_000_000
    out = []
    for c in range(streams):
        out.append(ConnOpen(start, SERVER_PID, SERVER_PID, 10 + c, 100 + c, 2, "127.0.0.1", 8000, "127.0.0.1", 40000 + c,
                            RoleHint.ACCEPTED))
        out.append(ConnOpen(start, CLIENT_PID, CLIENT_PID, 10 + c, 200 + c, 2, "127.0.0.1", 40000 + c, "127.0.0.1", 8000,
                            RoleHint.CONNECTED))
    chunks = 0
    for c in range(streams):
        ts = start + 1000 + c * 37_000
        for n in range(c, calls, streams):
            head, body, response = call_bytes(n + 1, tokens)
            chunks += len(response) - 1
            sfd, cfd, sconn, cconn = 10 + c, 10 + c, 100 + c, 200 + c
            out.append(DataEvent(ts, CLIENT_PID, CLIENT_PID, cfd, cconn, egress, len(head), head))
            out.append(DataEvent(ts + 5_000, CLIENT_PID, CLIENT_PID, cfd, cconn, egress, len(body), body))
            out.append(DataEvent(ts + 50_000, SERVER_PID, SERVER_PID, sfd, sconn, ingress, len(head + body), head + body))
            ts += 100_000
            stream = b""
            read_from = 0
            for i, piece in enumerate(response):
                out.append(DataEvent(ts, SERVER_PID, SERVER_PID, sfd, sconn, egress, len(piece), piece))
                stream += piece
                if i == 0:  # the client reads the head at once
                    out.append(DataEvent(ts + 20_000, CLIENT_PID, CLIENT_PID, cfd, cconn, ingress, len(piece), piece))
                    read_from = len(stream)
                while len(stream) - read_from >= CLIENT_READ or (i == len(response) - 1 and len(stream) > read_from):
                    read = stream[read_from : read_from + CLIENT_READ]
                    read_from += len(read)
                    out.append(DataEvent(ts + 20_000, CLIENT_PID, CLIENT_PID, cfd, cconn, ingress, len(read), read))
                ts += TOKEN_INTERVAL_NS
            ts += 100_000
    out.sort(key=lambda e: e.ts_ns)
    return out, chunks


def in_process_round(events: list, taps: bool) -> tuple[float, int]:
    """CPU seconds for the events through a live pipeline (GenAI attached; ``taps`` off: every
    chunk as a progress event), drained every 10 ms of their time; and the spans exported."""
    import gc

    from pipeline_hot_path import EncodingSink, NoSource

    from otelbpf.core.selfmetrics import Counters
    from otelbpf.export import BatchSpanProcessor
    from otelbpf.host.resources import ProcessResources
    from otelbpf.metrics import MeteredProcessor, SpanMetrics
    from otelbpf.registry import default_instruments
    from otelbpf.assembly import build_pipeline

    counters = Counters()
    resources = ProcessResources(describe=lambda pid, comm: {"service.name": "llm", "process.pid": pid})
    sink = EncodingSink()
    processor = BatchSpanProcessor([sink], resources, counters)
    pipeline = build_pipeline(MeteredProcessor(processor, SpanMetrics(resources, default_instruments()), None),
                              resources, counters, source=NoSource())
    layer = pipeline.registry.semantics("http1").genai
    if layer is not None:
        layer.body_taps = taps
    drains, drain, edge = [], [], events[0].ts_ns + DRAIN_NS
    for event in events:
        if event.ts_ns >= edge:
            drains.append(drain)
            drain, edge = [], event.ts_ns + DRAIN_NS
        drain.append(event)
    drains.append(drain)
    gc.collect()
    started = time.process_time()
    for drain in drains:
        pipeline.handle(drain)
    pipeline.finish()
    processor.shutdown()
    return time.process_time() - started, sink.spans


def in_process_main(args) -> int:
    events, chunks = in_process_events(args.calls, args.tokens, args.threads)
    in_process_round(events[: len(events) // 10], True)  # warm-up: imports, caches
    from otelbpf.runtime import gctune

    gctune.tune()  # as `otelbpf run` sets the collector
    print(f"{args.calls} calls x {args.tokens} tokens over {args.threads} streams ({chunks:,} SSE chunks per side), "
          f"both sides traced; CPU us per SSE chunk per side, {args.rounds} rounds")
    for taps in (True, False):
        runs = []
        for _ in range(args.rounds):
            cpu, spans = in_process_round(events, taps)
            if spans != 2 * args.calls:
                print(f"llm_stream: {spans} spans for {args.calls} calls (2 expected per call)", file=sys.stderr)
                return 1
            runs.append(1e6 * cpu / (2 * chunks))
        label = "taps on (the agent)" if taps else "taps off (a progress event per chunk)"
        print(f"  {label:38s} best {min(runs):5.2f}   median {statistics.median(runs):5.2f}")
    return 0


# -- the bench -----------------------------------------------------------------------------


def start_server(children: Children, options: list[str] | None = None) -> tuple[object, int]:
    """The bundled OpenAI-compatible mock on a free port (with ``options``): its process and port."""
    proc = children.start(
        "openai mock", [sys.executable, str(ROOT / "examples" / "openai_mock_server.py"), "--port", "0", *(options or [])],
        stdout=__import__("subprocess").PIPE, text=True,
    )
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        raise BenchError(f"the mock server did not start: {line!r}")
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
    agent_start = proc_cpu_ticks(agent.pid) if agent else None
    out, _ = client.communicate("go\n", timeout=args.duration + 60)  # starts once the agent is attached
    children.forget(client)
    load = json.loads(out.strip().splitlines()[-1])
    result.update(load)
    result["tokens_per_s"] = load["tokens"] / load["seconds"]
    result["calls_per_s"] = load["calls"] / load["seconds"]
    if agent is not None:
        launcher.wait_idle(agent)
        agent_s = ((proc_cpu_ticks(agent.pid) or 0) - (agent_start or 0)) / CLK_TCK
        stopped = launcher.stop(agent)
        counts = receiver.counts()
        spans = counts["server_spans"] + counts["other_spans"]
        result.update(
            spans=spans,
            spans_per_s=spans / load["seconds"],
            spans_per_call=spans / max(1, load["calls"]),
            events_lost=stat(stopped["stats"], "otelbpf.events.lost"),
            agent_us_per_token=1e6 * agent_s / max(1, load["tokens"]),
            # both sides see every SSE chunk: per chunk per side
            agent_us_per_chunk_side=1e6 * agent_s / max(1, 2 * load.get("events", load["tokens"])),
            agent_us_per_span=1e6 * agent_s / max(1, spans),
        )
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=8.0, help="seconds of load per window (default 8)")
    p.add_argument("--threads", type=int, default=4, help="concurrent streams (default 4)")
    p.add_argument("--tokens", type=int, default=200, help="tokens per streamed response (default 200)")
    p.add_argument("--repo", help="run the agent from this checkout (before -> after: e.g. the base commit's tree, built)")
    p.add_argument("--agent-args", default="",
                   help="extra arguments for `otelbpf run` (e.g. \"--no-profiles\": the stack samples of the busy traced "
                        "threads are charged to the agent's CPU too)")
    p.add_argument("--in-process", action="store_true",
                   help="no eBPF: the calls' events through the pipeline in this process (CPU us per chunk per side)")
    p.add_argument("--calls", type=int, default=400, help="--in-process: calls per round (default 400)")
    p.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client:
        sys.stdin.readline()  # the bench says go (after attaching the agent to this process)
        client_main(args.port, args.threads, args.duration, args.tokens)
        return 0
    if args.in_process:
        return in_process_main(args)

    children = Children()
    receiver = None
    try:
        _server, port = start_server(children)
        receiver = CountingReceiver(children, None)
        command = AgentCommand.from_args(argparse.Namespace(repo=args.repo, otelbpf_cmd=None, agent_python=None))
        launcher = AgentLauncher(children, None, args.agent_args.split(), command)
        windows = []
        for r in range(args.rounds):
            for traced in (False, True):
                w = one_window(args, children, launcher, receiver, _server.pid, port, traced)
                windows.append(w)
                extra = (f", {w['spans_per_s']:,.0f} spans/s, agent {w['agent_us_per_token']:.2f} us/token "
                         f"({w['agent_us_per_chunk_side']:.2f} us/chunk/side), lost {w['events_lost']}"
                         if traced else "")
                print(f"round {r + 1} {w['mode']:3s}: {w['tokens_per_s']:,.0f} tokens/s, {w['calls_per_s']:,.1f} calls/s{extra}", flush=True)
        off = statistics.median(w["tokens_per_s"] for w in windows if w["mode"] == "off")
        on = [w for w in windows if w["mode"] == "on"]
        med = lambda key: statistics.median(w[key] for w in on)  # noqa: E731
        print(f"\n{args.threads} streams x {args.tokens} tokens, {args.rounds} rounds of {args.duration:.0f} s (medians)")
        print(f"  tokens/s            off {off:,.0f}   on {med('tokens_per_s'):,.0f}   ratio on/off {med('tokens_per_s') / off:.3f}")
        print(f"  spans/s (on)        {med('spans_per_s'):,.1f}  ({med('spans_per_call'):.2f} per call: client + server)")
        print(f"  agent CPU           {med('agent_us_per_token'):.2f} us per streamed token (both sides), "
              f"{med('agent_us_per_chunk_side'):.2f} us per SSE chunk per side, {med('agent_us_per_span'):.0f} us per span")
        print(f"  events lost (on)    {sum(w['events_lost'] for w in on)}")
    except BenchError as exc:
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
