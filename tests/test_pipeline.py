"""The pipeline's contract, in-process and without a kernel: events of every family
in, spans and metrics out, through the protocol registry.

* every exchange that starts ends exactly once, even when its session forgets
  to end it (connection close, eviction, process exit), and a dead exchange
  never becomes a later call's parent;
* a protocol added by files and one registration line (the toy protocol of
  tests/toy_protocol) goes from bytes to spans and metrics, over TCP and UDP;
* library calls become INTERNAL spans under the request their thread serves;
* progress (streamed body chunks) reaches observers with its time;
* detection and muting are per connection *and* source.
"""

from __future__ import annotations

import socket

import pytest

from otelbpf.core.events import (
    CallEvent,
    ConnClose,
    ConnOpen,
    DataEvent,
    DatagramEvent,
    ProcessExit,
    ProcessStart,
    RoleHint,
    Source,
)
from otelbpf.core.model import SpanKind, SpanRecord, StatusCode
from otelbpf.core.selfmetrics import Counters
from otelbpf.host.resources import ProcessResources
from otelbpf.metrics.histograms import SpanMetrics
from otelbpf.pipeline import Pipeline
from otelbpf.registry import Registry, default_registry
from otelbpf.semantics.common import CallSemantics, outcome_status, span_record
from protocols.base import Detector, Direction, ExchangeKind, ExchangeStarted, Outcome, Phase, Transport
from tests import toy_protocol

IN, OUT = Direction.INGRESS, Direction.EGRESS
GET = b"GET /items/42 HTTP/1.1\r\nHost: backend:8081\r\nUser-Agent: test\r\n\r\n"
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class Collect:
    def __init__(self) -> None:
        self.spans: list[SpanRecord] = []

    def on_end(self, span: SpanRecord) -> None:
        self.spans.append(span)


class Metered:
    """A consumer that also feeds span metrics (as MeteredProcessor does: ``span_metrics``);
    put in front with ``pipeline.wrap_consumer(lambda c: Metered(c, metrics))``."""

    def __init__(self, consumer, span_metrics) -> None:
        self.consumer, self.span_metrics = consumer, span_metrics

    def on_end(self, span: SpanRecord) -> None:
        self.consumer.on_end(span)
        self.span_metrics.record(span)


def make_pipeline(registry: Registry | None = None, **kwargs) -> tuple[Pipeline, Collect, Counters]:
    consumer, counters = Collect(), Counters()
    resources = ProcessResources(describe=lambda pid, comm: {"service.name": f"p{pid}"})
    return Pipeline(consumer, resources, counters, registry=registry, **kwargs), consumer, counters


def accepted(conn_id: int, pid: int, *, local_port: int = 8081, peer_port: int = 40000, fd: int = 5) -> ConnOpen:
    return ConnOpen(1, pid, pid, fd, conn_id, socket.AF_INET, "127.0.0.1", local_port, "127.0.0.1", peer_port, RoleHint.ACCEPTED)


def connected(conn_id: int, pid: int, *, local_port: int = 40000, peer_port: int = 8081, fd: int = 6) -> ConnOpen:
    return ConnOpen(1, pid, pid, fd, conn_id, socket.AF_INET, "127.0.0.1", local_port, "127.0.0.1", peer_port, RoleHint.CONNECTED)


def data(ts: int, conn_id: int, pid: int, direction: Direction, payload: bytes, *, tid: int = 0, source: int = 0, fd: int = 5):
    return DataEvent(ts, pid, tid or pid, fd, conn_id, direction, len(payload), payload, source=source)


# -- the shipped protocol through the registry ---------------------------------------


def test_http1_exchange_becomes_a_server_span_named_by_its_semantics() -> None:
    pipeline, out, counters = make_pipeline()
    pipeline.handle([accepted(1, 100), data(10, 1, 100, IN, GET), data(20, 1, 100, OUT, OK)])
    [span] = out.spans
    assert (span.name, span.kind, span.protocol, span.scope) == ("GET /items/{id}", SpanKind.SERVER, "http1", "otelbpf.http1")
    assert span.attributes["http.response.status_code"] == 200 and span.attributes["network.protocol.version"] == "1.1"
    assert (span.start_ns, span.end_ns) == (10, 20)
    assert counters.get("otelbpf.spans.created") == 1 and pipeline.open_exchanges == 0


def test_client_and_server_ends_of_one_connection_are_parent_and_child() -> None:
    pipeline, out, _ = make_pipeline()
    pipeline.handle(
        [
            connected(1, 100),
            accepted(2, 200),
            data(10, 1, 100, OUT, GET, fd=6),
            data(11, 2, 200, IN, GET),
            data(20, 2, 200, OUT, OK),
            data(21, 1, 100, IN, OK, fd=6),
        ]
    )
    server, client = out.spans
    assert (client.kind, server.kind) == (SpanKind.CLIENT, SpanKind.SERVER)
    assert server.parent_span_id == client.span_id and server.trace_id == client.trace_id
    assert server.attributes["otelbpf.association"] == "connection"


# -- the lifecycle the pipeline enforces ---------------------------------------------


class LeakySession:
    """A broken session: starts an exchange per request line and never ends one, not even at close."""

    protocol = "leaky"

    def __init__(self, request_direction: Direction) -> None:
        self.kind = ExchangeKind.for_request(request_direction)
        self.parse_errors = 0

    def feed(self, direction, payload, ts_ns, missing=0):
        exchange = toy_protocol.protocol.ToyExchange("1", "leak", ts_ns, self.kind)
        exchange.protocol = "leaky"
        return [ExchangeStarted(exchange)] if payload.startswith(b"LEAK") else []

    def close(self, ts_ns):
        return []


class LeakyDetector(Detector):
    protocol = "leaky"
    transports = Transport.STREAM

    def detect(self, direction, payload):
        return direction if payload.startswith(b"LEAK") else None

    def new_session(self, request_direction):
        return LeakySession(request_direction)


class LeakySemantics:
    protocol = "leaky"

    def span(self, start, exchange, conn, options):
        attrs: dict = {}
        status, message = outcome_status(exchange, False, attrs)
        return span_record(start, exchange, "leak", attrs, status, message)


def leaky_registry() -> Registry:
    registry = default_registry()
    registry.register(LeakyDetector(), LeakySemantics())
    return registry


@pytest.mark.parametrize(
    ("ending", "outcome"),
    [
        (lambda: ConnClose(50, 100, 100, 5, 1), Outcome.CONNECTION_CLOSED),
        (lambda: ProcessExit(50, 100), Outcome.PROCESS_EXITED),
    ],
    ids=["connection-closed", "process-exited"],
)
def test_an_exchange_a_session_leaks_is_ended_once_and_never_parents_a_later_call(ending, outcome) -> None:
    pipeline, out, counters = make_pipeline(leaky_registry())
    pipeline.handle([accepted(1, 100), data(10, 1, 100, IN, b"LEAK 1\n"), ending()])
    [leaked] = out.spans
    assert leaked.name == "leak" and leaked.end_ns == 50
    assert leaked.attributes["otelbpf.exchange.end_reason"] == outcome.value
    assert leaked.status_code == StatusCode.ERROR
    assert counters.get("otelbpf.exchanges.unended", "leaky") == 1 and pipeline.open_exchanges == 0
    # A later call from a background thread of the same process: the dead
    # request must not be its parent (the process rule would have picked it).
    pipeline.handle([connected(2, 100, fd=7), data(60, 2, 100, OUT, GET, tid=999, fd=7), data(70, 2, 100, IN, OK, tid=999, fd=7)])
    call = out.spans[-1]
    assert call.kind == SpanKind.CLIENT and call.parent_span_id == b""
    assert call.attributes.get("otelbpf.association", "") == ""


def test_an_exchange_left_open_on_an_evicted_connection_ends_as_evicted() -> None:
    pipeline, out, counters = make_pipeline(leaky_registry(), max_connections=1)
    pipeline.handle([accepted(1, 100), data(10, 1, 100, IN, b"LEAK 1\n"), accepted(2, 100, fd=6, peer_port=40001)])
    [leaked] = out.spans
    assert leaked.attributes["otelbpf.exchange.end_reason"] == "connection_evicted"
    assert counters.get("otelbpf.connections.evicted") == 1



def test_a_connection_evicted_by_data_in_the_same_batch_ends_what_its_session_reported() -> None:
    """The request's start still waits for the batch's association pass when a later event
    evicts its connection: the eviction must associate it first, or it stays open forever."""
    pipeline, out, counters = make_pipeline(leaky_registry(), max_connections=1)
    pipeline.handle([accepted(1, 100), data(10, 1, 100, IN, b"LEAK 1\n"), data(20, 2, 100, IN, GET, fd=6)])
    [leaked] = out.spans
    assert leaked.attributes["otelbpf.exchange.end_reason"] == "connection_evicted"
    assert counters.get("otelbpf.protocol.violations", "leaky") == 0
    assert pipeline.open_exchanges == 1, "only the second connection's request is open"

def test_agent_stop_ends_what_is_open() -> None:
    pipeline, out, _ = make_pipeline(leaky_registry())
    pipeline.handle([accepted(1, 100), data(10, 1, 100, IN, b"LEAK 1\n")])
    pipeline.finish(99)
    [leaked] = out.spans
    assert leaked.attributes["otelbpf.exchange.end_reason"] == "agent_stopped" and leaked.end_ns == 99


class TwiceSession(LeakySession):
    """Ends the same exchange twice."""

    protocol = "leaky"

    def feed(self, direction, payload, ts_ns, missing=0):
        from protocols.base import ExchangeCompleted

        [started] = super().feed(direction, payload, ts_ns)
        return [started, ExchangeCompleted(started.exchange), ExchangeCompleted(started.exchange)]


def test_a_second_end_of_one_exchange_is_a_counted_violation_not_a_second_span() -> None:
    registry = leaky_registry()
    detector = registry.detectors()[-1]
    detector.new_session = TwiceSession  # type: ignore[method-assign]
    pipeline, out, counters = make_pipeline(registry)
    pipeline.handle([accepted(1, 100), data(10, 1, 100, IN, b"LEAK 1\n")])
    assert len(out.spans) == 1 and counters.get("otelbpf.protocol.violations", "leaky") == 1


def test_a_span_mapping_that_raises_costs_a_counted_span_not_the_pipeline() -> None:
    class Broken(LeakySemantics):
        def span(self, start, exchange, conn, options):
            raise RuntimeError("bug")

    registry = default_registry()
    registry.register(LeakyDetector(), Broken())
    pipeline, out, counters = make_pipeline(registry)
    pipeline.handle([accepted(1, 100), data(10, 1, 100, IN, b"LEAK 1\n"), ConnClose(20, 100, 100, 5, 1)])
    assert out.spans == [] and counters.get("otelbpf.spans.failed", "leaky") == 1
    pipeline.handle([accepted(2, 100), data(30, 2, 100, IN, GET), data(40, 2, 100, OUT, OK)])
    assert [s.name for s in out.spans] == ["GET /items/{id}"]



def test_a_batchs_spans_reach_the_consumer_after_its_events_in_the_order_they_ended() -> None:
    """Spans are handed on once per batch (the consumers' code then runs warm, span after
    span, DEVELOPERS.md "Run each stage over the batch"), still in the order they ended."""
    seen: list[tuple[str, int]] = []

    class Watch:
        def on_end(self, span: SpanRecord) -> None:
            seen.append((span.attributes["url.path"], pipeline.last_ts_ns))

    pipeline, _, _ = make_pipeline()
    pipeline.consumer = Watch()
    second = GET.replace(b"/items/42", b"/items/7")
    pipeline.handle([
        accepted(1, 100), accepted(2, 100, peer_port=40001, fd=6),
        data(10, 2, 100, IN, second, fd=6), data(20, 1, 100, IN, GET),
        data(30, 1, 100, OUT, OK), data(40, 2, 100, OUT, OK, fd=6),
        data(50, 1, 100, IN, GET),
    ])
    assert seen == [("/items/42", 50), ("/items/7", 50)]



def test_a_backlog_drained_at_once_is_passed_in_bounded_slices() -> None:
    """A batch far larger than a drain's (a backlog) must not hold every report and span until
    its end: memory stays bounded and the export queue is fed along the way."""
    from otelbpf.pipeline import PASS_LIMIT

    requests = PASS_LIMIT + 100
    seen: list[tuple[int, int]] = []

    class Watch:
        def on_end(self, span: SpanRecord) -> None:
            seen.append((span.start_ns, pipeline.last_ts_ns))

    pipeline, _, _ = make_pipeline()
    pipeline.consumer = Watch()
    events = [accepted(1, 100)]
    for i in range(requests):
        events += [data(100 * i + 10, 1, 100, IN, GET), data(100 * i + 20, 1, 100, OUT, OK)]
    pipeline.handle(events)
    assert [start for start, _ in seen] == [100 * i + 10 for i in range(requests)], "every span, in order"
    last_event_ts = 100 * (requests - 1) + 20
    assert seen[0][1] < last_event_ts, "the first slice left before the batch's last event"
    assert pipeline.open_exchanges == 0

def test_a_batch_that_fails_midway_still_hands_on_the_spans_it_finished() -> None:
    pipeline, out, _ = make_pipeline()

    def exit_hook_bug(pid: int) -> None:
        raise RuntimeError("bug in a hook")

    pipeline.on_process_exit = exit_hook_bug
    with pytest.raises(RuntimeError):
        pipeline.handle([accepted(1, 100), data(10, 1, 100, IN, GET), data(20, 1, 100, OUT, OK), ProcessExit(30, 100)])
    assert [span.name for span in out.spans] == ["GET /items/{id}"]
    pipeline.on_process_exit = None
    pipeline.handle([accepted(2, 101), data(40, 2, 101, IN, GET), data(50, 2, 101, OUT, OK)])
    assert len(out.spans) == 2, "the next batch is delivered as usual"


# -- a protocol added by files and one registration line ------------------------------


def toy_requests(ts: int, ids: list[str]) -> bytes:
    return b"".join(f"REQ {i} get\n".encode() for i in ids)


def test_toy_protocol_over_tcp_bytes_to_spans_and_metrics() -> None:
    registry = toy_protocol.register(default_registry())
    pipeline, out, counters = make_pipeline(registry)
    metrics = SpanMetrics(pipeline.resources, registry.instruments())
    pipeline.consumer = _Tee(out, metrics)
    pipeline.handle(
        [
            connected(1, 10, local_port=5000, peer_port=7000),
            accepted(2, 20, local_port=7000, peer_port=5000),
            # two requests in one write, the second split across reads; replies out of order
            data(1, 1, 10, OUT, b"REQ a get\nREQ b put\n", fd=6),
            data(2, 2, 20, IN, b"REQ a get\nREQ b "),
            data(3, 2, 20, IN, b"put\n"),
            data(4, 2, 20, OUT, b"REP b OK\n"),
            data(5, 2, 20, OUT, b"REP a ERR\n"),
            data(6, 1, 10, IN, b"REP b OK\nREP a ERR\n", fd=6),
        ]
    )
    by_side = {(s.kind, s.attributes["toy.verb"]): s for s in out.spans}
    assert set(by_side) == {(k, v) for k in (SpanKind.CLIENT, SpanKind.SERVER) for v in ("get", "put")}
    for verb in ("get", "put"):
        client, server = by_side[(SpanKind.CLIENT, verb)], by_side[(SpanKind.SERVER, verb)]
        assert server.parent_span_id == client.span_id  # paired by tuple + correlation key (request id)
        assert client.name == f"toy {verb}" and client.attributes["network.transport"] == "tcp"
    assert by_side[(SpanKind.SERVER, "get")].status_code == StatusCode.ERROR
    assert (by_side[(SpanKind.SERVER, "put")].start_ns, by_side[(SpanKind.SERVER, "put")].end_ns) == (3, 4)  # a line starts once whole
    points = _points(metrics)
    assert points["toy.server.duration"] == {("get", "ERR"): 1, ("put", "OK"): 1}
    assert points["toy.client.duration"] == {("get",): 1, ("put",): 1}
    assert "http.server.request.duration" not in points  # a toy span is not an HTTP measurement


def test_toy_protocol_over_udp_one_flow_per_peer() -> None:
    registry = toy_protocol.register(default_registry())
    pipeline, out, _ = make_pipeline(registry)
    metrics = SpanMetrics(pipeline.resources, registry.instruments())
    pipeline.consumer = _Tee(out, metrics)

    def socket_open(conn_id: int, pid: int, port: int) -> ConnOpen:
        return ConnOpen(1, pid, pid, 3, conn_id, socket.AF_INET, "127.0.0.1", port)

    def dgram(ts, conn_id, pid, direction, payload, peer_port):
        return DatagramEvent(ts, pid, pid, 3, conn_id, direction, len(payload), payload, "127.0.0.1", peer_port, socket.AF_INET)

    pipeline.handle(
        [
            socket_open(1, 10, 5000),  # client A
            socket_open(2, 11, 5001),  # client B
            socket_open(3, 20, 6000),  # the server's one socket
            dgram(1, 1, 10, OUT, b"REQ x get\n", 6000),
            dgram(2, 2, 11, OUT, b"REQ x put\n", 6000),  # same id, other client: another flow
            dgram(3, 3, 20, IN, b"REQ x get\n", 5000),
            dgram(4, 3, 20, IN, b"REQ x put\n", 5001),
            dgram(5, 3, 20, OUT, b"REP x OK\n", 5001),
            dgram(6, 3, 20, OUT, b"REP x OK\n", 5000),
            dgram(7, 2, 11, IN, b"REP x OK\n", 6000),
            dgram(8, 1, 10, IN, b"REP x OK\n", 6000),
        ]
    )
    assert len(out.spans) == 4 and all(s.attributes["network.transport"] == "udp" for s in out.spans)
    servers = {s.attributes["network.peer.port"]: s for s in out.spans if s.kind == SpanKind.SERVER}
    clients = {s.pid: s for s in out.spans if s.kind == SpanKind.CLIENT}
    assert servers[5000].parent_span_id == clients[10].span_id and servers[5000].attributes["toy.verb"] == "get"
    assert servers[5001].parent_span_id == clients[11].span_id and servers[5001].attributes["toy.verb"] == "put"
    assert (servers[5000].start_ns, servers[5000].end_ns) == (3, 6)
    assert sum(_points(metrics)["toy.server.duration"].values()) == 2


# -- library calls, progress, sources ----------------------------------------------


class ToyCalls(CallSemantics):
    library = "toylib"

    def span(self, start, call):
        if call.function == "cheap":
            return None
        return SpanRecord(
            start.trace_id, start.span_id, call.function, start.kind, call.ts_ns, call.end_ns, start.pid,
            start.parent_span_id, {"toylib.arg0": call.args[0]}, protocol="toylib",
        )  # fmt: skip


def test_a_library_call_becomes_an_internal_child_of_the_request_its_thread_serves() -> None:
    registry = default_registry()
    registry.register_calls(ToyCalls())
    pipeline, out, counters = make_pipeline(registry)
    pipeline.handle(
        [
            ProcessStart(1, 100, "server"),
            accepted(1, 100),
            data(10, 1, 100, IN, GET, tid=101),
            CallEvent(12, 15, 100, 101, "toylib", "copy", (4096,)),
            CallEvent(13, 13, 100, 101, "toylib", "cheap", ()),
            CallEvent(14, 14, 100, 101, "otherlib", "x", ()),
            data(20, 1, 100, OUT, OK, tid=101),
            CallEvent(30, 31, 100, 101, "toylib", "after", (1,)),  # the request is over: a root
        ]
    )
    copy, server, after = out.spans
    assert (copy.name, copy.kind, copy.attributes["toylib.arg0"]) == ("copy", SpanKind.INTERNAL, 4096)
    assert copy.parent_span_id == server.span_id and copy.trace_id == server.trace_id
    assert after.parent_span_id == b""
    assert counters.get("otelbpf.calls.unhandled", "otherlib") == 1


def test_progress_observers_see_every_response_chunk_with_its_time() -> None:
    pipeline, out, _ = make_pipeline()
    seen = []
    pipeline.observe_progress("http1", lambda start, progress: seen.append((start.span_id, progress.phase, progress.ts_ns, progress.data)))
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    pipeline.handle(
        [
            accepted(1, 100),
            data(10, 1, 100, IN, GET),
            data(20, 1, 100, OUT, head),
            data(21, 1, 100, OUT, b"5\r\nfirst\r\n"),
            data(29, 1, 100, OUT, b"4\r\nlast\r\n0\r\n\r\n"),
        ]
    )
    [span] = out.spans
    assert seen == [
        (span.span_id, Phase.RESPONSE_START, 20, b""),
        (span.span_id, Phase.RESPONSE_BODY, 21, b"first"),
        (span.span_id, Phase.RESPONSE_BODY, 29, b"last"),
    ]


def test_detection_and_muting_are_per_connection_and_source() -> None:
    muted = []
    pipeline, out, counters = make_pipeline(on_unrecognized=lambda conn: muted.append((conn.conn_id, conn.source)))
    ciphertext = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(40)
    events = [accepted(1, 100)]
    for ts in range(4):  # TLS records on the socket: no protocol we know
        events.append(data(ts, 1, 100, IN if ts % 2 == 0 else OUT, ciphertext))
    events += [data(10, 1, 100, IN, GET, source=Source.TLS), data(20, 1, 100, OUT, OK, source=Source.TLS)]
    pipeline.handle(events)
    assert muted == [(1, Source.SOCKET)]
    [span] = out.spans  # the plaintext still became a span, with the socket's tuple
    assert span.name == "GET /items/{id}" and span.attributes["network.peer.port"] == 40000
    assert counters.get("otelbpf.connections.unrecognized") == 1


def test_unknown_event_types_are_counted_not_raised() -> None:
    pipeline, _, counters = make_pipeline()
    pipeline.handle([object()])  # type: ignore[list-item]
    assert counters.get("otelbpf.events.unknown") == 1


class _Tee:
    def __init__(self, *consumers) -> None:
        self.consumers = consumers

    def on_end(self, span: SpanRecord) -> None:
        for consumer in self.consumers:
            (consumer.on_end if hasattr(consumer, "on_end") else consumer.record)(span)


def _points(metrics: SpanMetrics) -> dict[str, dict[tuple, int]]:
    out: dict[str, dict[tuple, int]] = {}
    for process in metrics.collect().processes:
        for instrument, points in process.histograms:
            for point in points:
                key = tuple(point.attributes.get(name) for name in instrument.attributes)
                out.setdefault(instrument.name, {})[key] = out.get(instrument.name, {}).get(key, 0) + point.count
    return out


def test_a_detector_must_declare_its_capabilities_by_subclassing_the_contract():
    class DuckDetector:  # has detect and new_session, but not the declared capabilities
        protocol = "duck"
        transports = Transport.STREAM

        def detect(self, direction, payload):
            return None

        def new_session(self, request_direction):
            return LeakySession(request_direction)

    with pytest.raises(TypeError, match="must subclass protocols.base.Detector"):
        Registry().register(DuckDetector(), LeakySemantics())
    detector = LeakyDetector()  # inherits the defaults
    assert (detector.report_progress, detector.progress_filter, detector.per_process_sessions) == (False, None, False)
    assert detector.take_notices() == [] and detector.take_counts() == []
