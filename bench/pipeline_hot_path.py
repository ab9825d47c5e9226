"""User-space CPU per traced request, without the kernel, the network or noise.

Feeds the agent's real chain (Pipeline with GenAI attached, connection table,
HTTP/1 parser, association, span building, RED metrics, batch processor and the
OTLP protobuf encoding) with the events nginx produces under wrk: keep-alive
connections, one request read and one response written per request, server side
traced. ``--protocol grpc``: the server side of unary gRPC calls instead, written
as grpcio writes them (one read of HEADERS, DATA and WINDOW_UPDATEs, one write of
HEADERS, DATA, trailers and a WINDOW_UPDATE; HPACK tables built from the
connection preface on). The sink encodes each batch (as the OTLP sinks do) and discards it, so
nothing waits on a socket. Reports CPU microseconds per request, end to end and
with the export thread's encoding included (process time, so other load on the
machine barely moves it)::

    .venv/bin/python bench/pipeline_hot_path.py [--requests N] [--connections C] [--rounds R] [--gc agent|default]
    .venv/bin/python bench/pipeline_hot_path.py --protocol grpc     # unary gRPC calls over HTTP/2
    OTELBPF_PURE=1 .venv/bin/python bench/pipeline_hot_path.py    # the pure-Python modules
    perf record -g .venv/bin/python bench/pipeline_hot_path.py     # native symbols, inside compiled code

The garbage collector is set as ``otelbpf run`` sets it once started
(``otelbpf.runtime.gctune``; ``--gc default`` keeps CPython's thresholds), and the
time it took is reported apart (``gc.callbacks``).

No eBPF and no root needed. bench/nginx_wrk.py measures the live agent
(ring-buffer reads, decode, threads, gRPC); this isolates what the hot-path
code costs, so a change to it can be judged in seconds.
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from otelbpf.core.events import ConnOpen, DataEvent, RoleHint  # noqa: E402
from otelbpf.core.selfmetrics import Counters  # noqa: E402
from otelbpf.export import BatchSpanProcessor  # noqa: E402
from otelbpf.export.sinks import SpanBatch  # noqa: E402
from otelbpf.host.resources import ProcessResources  # noqa: E402
from otelbpf.metrics import MeteredProcessor, SpanMetrics  # noqa: E402
from otelbpf.registry import default_instruments  # noqa: E402
from otelbpf.assembly import build_pipeline  # noqa: E402
from protocols.base import Direction  # noqa: E402

NGINX = 4242

REQUEST = b"GET /index.html HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: wrk\r\n\r\n"
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Mon, 23 Nov 2026 03:00:00 GMT\r\n"
    b"Content-Type: text/html\r\nContent-Length: 612\r\nLast-Modified: Mon, 23 Nov 2026 01:00:00 GMT\r\n"
    b"Connection: keep-alive\r\nETag: \"6540-264\"\r\nAccept-Ranges: bytes\r\n\r\n" + b"x" * 612
)


class EncodingSink:
    """Encodes every batch to OTLP protobuf bytes, like the OTLP sinks, then drops it."""

    name = "encode-only"
    #: Like the OTLP sinks: the processor may encode batches as it seals them (otelbpf.otlp.sink.Sink).
    reads_payload_only = True

    def __init__(self) -> None:
        self.spans = 0
        self.bytes = 0

    def export(self, batch: SpanBatch) -> bool:
        self.bytes += len(batch.payload)
        self.spans += len(batch)
        return True

    def flush(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


class NoSource:
    def mute(self, *args) -> None:
        pass

    def watch_process(self, *args) -> None:
        pass

    def forget_process(self, *args) -> None:
        pass


def workload(requests: int, connections: int, batch: int = 256, protocol: str = "http1") -> tuple[list, list]:
    """(connection opens, data events in batches of ``batch`` as the ring drain delivers them)."""
    ts = 1_700_000_000_000_000_000
    port = 8080 if protocol == "http1" else 50051
    opens = [
        ConnOpen(ts, NGINX, NGINX, 10 + c, 1 + c, 2, "127.0.0.1", port, "127.0.0.1", 40000 + c, RoleHint.ACCEPTED)
        for c in range(connections)
    ]
    calls = grpc_calls(requests, connections) if protocol == "grpc" else None
    events = []
    for n in range(requests):
        c = n % connections
        request, response = (REQUEST, RESPONSE) if calls is None else calls[n]
        ts += 50_000
        events.append(DataEvent(ts, NGINX, NGINX, 10 + c, 1 + c, Direction.INGRESS, len(request), request))
        ts += 20_000
        events.append(DataEvent(ts, NGINX, NGINX, 10 + c, 1 + c, Direction.EGRESS, len(response), response))
    return opens, [events[i : i + batch] for i in range(0, len(events), batch)]


GRPC_REQUEST_FIELDS = [
    (":scheme", "http"), (":method", "POST"), (":authority", "127.0.0.1:50051"),
    (":path", "/inference.Inference/Predict"), ("te", "trailers"), ("content-type", "application/grpc"),
    ("user-agent", "grpc-python/1.85.0 grpc-c/51.0.0 (linux; chttp2)"),
    ("grpc-accept-encoding", "identity, deflate, gzip"),
]
GRPC_RESPONSE_FIELDS = [
    (":status", "200"), ("content-type", "application/grpc"), ("grpc-accept-encoding", "identity, deflate, gzip"),
]
GRPC_TRAILERS = [("grpc-status", "0")]


@functools.lru_cache(maxsize=2)
def grpc_calls(requests: int, connections: int) -> list[tuple[bytes, bytes]]:
    """The bytes of each call, made once (HPACK and framing in pure Python would
    otherwise dominate a profile of the run)."""
    channels = [GrpcConnection() for _ in range(connections)]
    return [channels[n % connections].call() for n in range(requests)]


class GrpcConnection:
    """One gRPC channel's bytes, call by call, framed and HPACK-encoded as grpcio does
    (examples/grpc_service.py's Predict, recorded in protocols/http2/tests/grpc_all.json)."""

    def __init__(self) -> None:
        from hpack import Encoder

        self._client = Encoder()
        self._server = Encoder()
        self._stream = 1
        self._preface = True

    def call(self) -> tuple[bytes, bytes]:
        """(what the server reads, what it writes) for the next unary call."""
        from hyperframe.frame import DataFrame, HeadersFrame, SettingsFrame, WindowUpdateFrame

        from protocols.http2.types import PREFACE

        stream, self._stream = self._stream, self._stream + 2
        message = b"\x00" + (10).to_bytes(4, "big") + b"0123456789"
        request = bytearray()
        response = bytearray()
        if self._preface:
            self._preface = False
            request += PREFACE + SettingsFrame(0).serialize()
            response += SettingsFrame(0).serialize() + SettingsFrame(0, flags=["ACK"]).serialize()
        request += HeadersFrame(stream, self._client.encode(GRPC_REQUEST_FIELDS), flags=["END_HEADERS"]).serialize()
        request += WindowUpdateFrame(stream, window_increment=5).serialize()
        request += DataFrame(stream, message, flags=["END_STREAM"]).serialize()
        request += WindowUpdateFrame(0, window_increment=15).serialize()
        response += HeadersFrame(stream, self._server.encode(GRPC_RESPONSE_FIELDS), flags=["END_HEADERS"]).serialize()
        response += DataFrame(stream, message).serialize()
        response += HeadersFrame(stream, self._server.encode(GRPC_TRAILERS), flags=["END_HEADERS", "END_STREAM"]).serialize()
        response += WindowUpdateFrame(0, window_increment=15).serialize()
        return bytes(request), bytes(response)


class GcClock:
    """Wall time spent in cyclic garbage collection (gc.callbacks), summed."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started


class CacheEvictor:
    """Overwrites ``kib`` KiB between drains, as the traced server, its clients
    and the kernel do to the CPU caches while the agent sleeps: the live agent
    finds each connection's state cold, which a tight loop never does."""

    def __init__(self, kib: int) -> None:
        self._source = bytearray(b"\x5a" * (kib * 512))
        self._target = bytearray(kib * 512)

    def __call__(self) -> float:
        """Evict (a copy between two preallocated halves: no allocation, no
        page faults); returns the CPU seconds that took, to leave out."""
        started = time.thread_time()
        self._target[:] = self._source
        self._source, self._target = self._target, self._source
        return time.thread_time() - started


def run_once(requests: int, connections: int, evict_kib: int = 0, batch: int = 256, protocol: str = "http1") -> tuple[float, int]:
    """CPU seconds (this process, all threads) for ``requests`` requests, and the spans exported.

    With ``evict_kib``, that much memory is overwritten before each batch of
    ``batch`` events (one drain of the ring), and the time spent doing it is
    left out."""
    counters = Counters()
    resources = ProcessResources(describe=lambda pid, comm: {"service.name": "nginx", "process.pid": pid})
    sink = EncodingSink()
    processor = BatchSpanProcessor([sink], resources, counters)
    consumer = MeteredProcessor(processor, SpanMetrics(resources, default_instruments()), None)
    pipeline = build_pipeline(consumer, resources, counters, source=NoSource())
    opens, batches = workload(requests, connections, batch, protocol)
    pipeline.handle(opens)
    evict = CacheEvictor(evict_kib) if evict_kib else None
    evicting = 0.0
    gc.collect()
    started = time.process_time()
    for events in batches:
        if evict is not None:
            evicting += evict()
        pipeline.handle(events)
    processor.shutdown()
    return time.process_time() - started - evicting, sink.spans


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=50_000)
    p.add_argument("--connections", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch", type=int, default=256, help="events per drain (default 256; 10k req/s drained every 10 ms is 200)")
    p.add_argument("--evict-kib", type=int, default=0,
                   help="overwrite this much memory before each drain, as the server and the kernel do between the "
                        "live agent's drains, so per-connection state is cold (e.g. 8192 with --connections 300; "
                        "default 0: everything stays cached)")
    p.add_argument("--gc", choices=("agent", "default"), default="agent",
                   help="garbage collector as `otelbpf run` sets it (otelbpf.runtime.gctune), or CPython's defaults")
    p.add_argument("--protocol", choices=("http1", "grpc"), default="http1",
                   help="nginx's HTTP/1.1 exchanges (default), or the server side of unary gRPC calls")
    args = p.parse_args()
    run_once(2_000, args.connections, args.evict_kib, args.batch, args.protocol)  # warm-up: imports, caches
    if args.gc == "agent":
        from otelbpf.runtime import gctune

        gctune.tune()
    clock = GcClock()
    per_request = []
    for _ in range(args.rounds):
        cpu, spans = run_once(args.requests, args.connections, args.evict_kib, args.batch, args.protocol)
        if spans != args.requests:
            print(f"pipeline_hot_path: {spans} spans for {args.requests} requests", file=sys.stderr)
            return 1
        per_request.append(1e6 * cpu / args.requests)
    gc_per_request = 1e6 * clock.seconds / (args.rounds * args.requests)
    evicting = f", {args.evict_kib} KiB evicted before each drain of {args.batch} events" if args.evict_kib else ""
    what = "unary gRPC calls" if args.protocol == "grpc" else "requests"
    print(f"{args.requests:,} {what} x {args.rounds} rounds, {args.connections} keep-alive connections{evicting}, gc {args.gc}")
    print(f"of which cyclic garbage collection: {gc_per_request:.2f} us per request (wall time)")
    print(f"user-space CPU per request (pipeline + metrics + OTLP encoding): median {statistics.median(per_request):.2f} us, "
          f"min {min(per_request):.2f}, max {max(per_request):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
