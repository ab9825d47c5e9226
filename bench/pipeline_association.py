"""How much does linking spans into traces cost the pipeline?

Feeds the real Pipeline (connection table, HTTP/1 parser, span building)
with the events a gateway -> backend pair produces, both processes traced:
per request, the gateway reads a request, calls the backend, the backend
reads and answers, the gateway answers. CONCURRENCY requests are in flight
at once, on CONCURRENCY gateway threads, interleaved. Runs the same events
with association on (otelbpf.core.association.Linker) and off (every span a
root), alternated, and reports spans/s and the ratio. Then measures the
memory held per open request (request read, not answered yet).

    .venv/bin/python bench/pipeline_association.py [--requests N] [--concurrency C] [--rounds R]

No eBPF and no root needed: this measures the user-space pipeline only.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import tracemalloc

from otelbpf.core.association import Linker
from otelbpf.core.events import ConnOpen, DataEvent, RoleHint
from otelbpf.core.identity import SpanStart, TraceGroup
from otelbpf.core.model import new_span_id, new_trace_id
from otelbpf.core.selfmetrics import Counters
from otelbpf.host.resources import ProcessResources
from otelbpf.pipeline import Pipeline
from protocols.base import Direction

GATEWAY, BACKEND = 1000, 2000


class RootsOnly(Linker):
    """Association off: every span a root, nothing remembered."""

    def start(self, conn, headers, kind, pid, tid, ts_ns, task_id=0):
        return SpanStart(TraceGroup(new_trace_id()), new_span_id(), b"", kind, pid, tid)

    def end(self, start, ts_ns, task_id=0):
        return []


class CountingConsumer:
    def __init__(self) -> None:
        self.spans = 0
        self.linked = 0

    def on_end(self, span) -> None:
        self.spans += 1
        self.linked += bool(span.parent_span_id)


def request_bytes(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: backend:8081\r\nUser-Agent: bench/1.0\r\nAccept: */*\r\n\r\n".encode()


def response_bytes(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def workload(requests: int, concurrency: int) -> list:
    """Events of ``requests`` gateway requests, ``concurrency`` interleaved."""
    events: list = []
    ts = 1_700_000_000_000_000_000
    conn_id = 0
    lanes = []
    for lane in range(concurrency):
        tid = GATEWAY + 1 + lane
        ids = (conn_id + 1, conn_id + 2, conn_id + 3)  # client->gateway, gateway->backend (both ends)
        conn_id += 3
        port_in, port_out = 40000 + lane, 50000 + lane
        events.append(ConnOpen(ts, GATEWAY, tid, 10, ids[0], 2, "10.0.0.1", 8080, "10.0.0.9", port_in, RoleHint.ACCEPTED))
        events.append(ConnOpen(ts, GATEWAY, tid, 11, ids[1], 2, "10.0.0.1", port_out, "10.0.0.2", 8081, RoleHint.CONNECTED))
        events.append(ConnOpen(ts, BACKEND, BACKEND + 1 + lane, 12, ids[2], 2, "10.0.0.2", 8081, "10.0.0.1", port_out, RoleHint.ACCEPTED))
        lanes.append((tid, BACKEND + 1 + lane, ids))
    body = b'{"id": 1, "name": "widget", "price": 42}'
    steps = []
    for n in range(requests):
        tid, backend_tid, (inbound, outbound, backend_in) = lanes[n % concurrency]
        path = f"/items/{n}"
        steps.append([
            (GATEWAY, tid, inbound, Direction.INGRESS, request_bytes("/api" + path)),
            (GATEWAY, tid, outbound, Direction.EGRESS, request_bytes(path)),
            (BACKEND, backend_tid, backend_in, Direction.INGRESS, request_bytes(path)),
            (BACKEND, backend_tid, backend_in, Direction.EGRESS, response_bytes(body)),
            (GATEWAY, tid, outbound, Direction.INGRESS, response_bytes(body)),
            (GATEWAY, tid, inbound, Direction.EGRESS, response_bytes(body)),
        ])
    # interleave: step k of every request in a wave of `concurrency` requests
    for wave in range(0, requests, concurrency):
        group = steps[wave : wave + concurrency]
        for k in range(6):
            for request in group:
                pid, tid, cid, direction, data = request[k]
                ts += 1000
                events.append(DataEvent(ts, pid, tid, 0, cid, direction, len(data), data))
    return events


def run_once(events: list, associate: bool) -> tuple[float, CountingConsumer]:
    consumer = CountingConsumer()
    pipeline = Pipeline(consumer, ProcessResources(describe=lambda pid, comm: {"service.name": str(pid)}), Counters())
    if not associate:
        pipeline.linker = RootsOnly(pipeline.counters)
    gc.collect()
    started = time.perf_counter()
    for i in range(0, len(events), 1024):
        pipeline.handle(events[i : i + 1024])
    elapsed = time.perf_counter() - started
    return consumer.spans / elapsed, consumer


def memory_per_open_request(count: int, associate: bool = True) -> float:
    """Bytes held per request that has been read and not answered."""
    events = workload(count, count)
    opens = [e for e in events if isinstance(e, ConnOpen)]
    first_reads = [e for e in events if isinstance(e, DataEvent)][:count]  # step 0 of every request
    pipeline = Pipeline(CountingConsumer(), ProcessResources(describe=lambda pid, comm: {}), Counters())
    if not associate:
        pipeline.linker = RootsOnly(pipeline.counters)
    pipeline.handle(opens)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    pipeline.handle(first_reads)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert not associate or pipeline.linker.open_windows == count
    return grown / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    events = workload(args.requests, args.concurrency)
    on, off = [], []
    for _ in range(args.rounds):
        rate, consumer = run_once(events, associate=True)
        on.append(rate)
        linked = consumer.linked
        rate, _ = run_once(events, associate=False)
        off.append(rate)
    spans = args.requests * 3
    print(f"workload: {args.requests} gateway requests ({spans} spans), {args.concurrency} in flight, {len(events)} events")
    print(f"association on : {statistics.median(on):9.0f} spans/s (median of {args.rounds}); {linked} of {spans} spans linked")
    print(f"association off: {statistics.median(off):9.0f} spans/s")
    print(f"ratio on/off   : {statistics.median(on) / statistics.median(off):.2f}x")
    for count in (100, 1000):
        total = memory_per_open_request(count)
        without = memory_per_open_request(count, associate=False)
        print(f"memory per open request ({count} open): {total:.0f} bytes, of which association {total - without:.0f}")


if __name__ == "__main__":
    main()
