"""The compiled HTTP/1 fast path against the reference: identical exchanges, spans and metrics.

The reference (protocols/http1's parser and session, the pipeline as it always ran) is
the specification; the fast path (otelbpf/fastpath/http1.pyx) takes the common shapes
and hands everything else to the reference (docs/fastpath.md). Here both are fed the
same inputs and every difference fails:

* every golden capture, replayed from each side with the fast path on and off: the
  same spans in the same order (names, kinds, times, attributes, status, parents,
  traces, links) and the same metric points;
* generated HTTP/1 conversations (odd methods, folded and malformed lines, chunked
  and close-delimited bodies, 1xx, HEAD, 204/304, upgrades, pipelining, capture gaps,
  observed LLM calls) cut into events at random boundaries, through one session of
  each kind (the session events, exchanges and parse error counts) and through whole
  pipelines with a gateway making a downstream call (the spans, parents included);
* the fast path is built and used: plain traffic never leaves it, and its share is
  counted in the self-metrics.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from otelbpf import fastpath
from otelbpf.cli.replay import replay_spans
from otelbpf.core.events import ConnOpen, DataEvent, RoleHint
from otelbpf.core.selfmetrics import Counters
from otelbpf.host.resources import ProcessResources
from otelbpf.metrics import SpanMetrics
from otelbpf.pipeline import Pipeline
from otelbpf.registry import default_registry
from otelbpf.semantics import genai
from protocols.base import Direction, ExchangeProgress
from protocols.http1 import Http1Detector

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(GOLDEN.glob("*/*.pcap"))
IN, OUT = Direction.INGRESS, Direction.EGRESS


def test_fast_path_is_built() -> None:
    """CI builds it (setup.py fails there otherwise); a local pure install must say so."""
    if not fastpath.available() and os.environ.get("OTELBPF_ALLOW_PURE") == "1" and not os.environ.get("CI"):
        pytest.skip(f"OTELBPF_ALLOW_PURE=1: {fastpath.UNAVAILABLE}")
    assert fastpath.available(), fastpath.UNAVAILABLE
    assert type(default_registry().detectors()[1]).__name__ == "FastHttp1Detector"


def test_fast_path_build_is_current() -> None:
    """Built after its source and after every .pxd it cimports (a changed field layout
    read at old offsets would be wrong, not slow)."""
    import importlib
    import re

    if not fastpath.available():
        pytest.skip("not built (test_fast_path_is_built says why)")
    root = Path(__file__).resolve().parents[1]
    module = importlib.import_module("otelbpf.fastpath.http1")
    built = Path(module.__file__).stat().st_mtime
    source = root / "otelbpf/fastpath/http1.pyx"
    cimports = re.findall(r"^from\s+([\w.]+)\s+cimport", source.read_text(), re.MULTILINE)
    sources = [source] + [root / (name.replace(".", "/") + ".pxd") for name in cimports if name.startswith(("otelbpf", "protocols"))]
    stale = [str(path.relative_to(root)) for path in sources if path.exists() and path.stat().st_mtime > built]
    assert not stale, f"otelbpf.fastpath.http1 is older than {stale}: .venv/bin/python setup.py build_ext --inplace"


# -- canonical forms: everything a consumer can see, with object identities as positions -------------


def canonical_spans(spans) -> list[tuple]:
    """The spans in the order they ended, IDs replaced by positions (random per run)."""
    position = {span.span_id: i for i, span in enumerate(spans)}
    traces: dict[bytes, int] = {}
    out = []
    for span in spans:
        trace = traces.setdefault(span.trace_id, len(traces))
        parent = position.get(span.parent_span_id, span.parent_span_id.hex() if span.parent_span_id else None)
        links = tuple(
            (position.get(link.span_id, link.span_id.hex()), tuple(sorted((link.attributes or {}).items())))
            for link in span.links or ()
        )
        out.append(
            (
                span.name, span.kind, span.start_ns, span.end_ns, span.pid, trace, parent, links,
                tuple(sorted(span.attributes.items())), span.status_code, span.status_message,
                span.trace_state, span.scope, span.protocol,
            )
        )
    return out


def metric_points(spans, registry) -> list[tuple]:
    """Every histogram point the spans give: instrument, attributes, count, sum, buckets."""
    metrics = SpanMetrics(ProcessResources(describe=lambda pid, comm: {"service.name": f"p{pid}"}), registry.instruments())
    for span in spans:
        metrics.record(span)
    out = []
    for process in metrics.collect().processes:
        for instrument, points in process.histograms:
            for point in points:
                out.append(
                    (
                        instrument.name, tuple(sorted(point.attributes.items())), point.count,
                        getattr(point, "sum", None), tuple(getattr(point, "bucket_counts", ()) or ()),
                    )
                )
    return sorted(out, key=repr)


def canonical_exchange(exchange) -> tuple:
    def message(m):
        if m is None:
            return None
        fields = [m.version, list(m.headers), m.start_ns, m.head_end_ns, m.end_ns, m.body_size, m.body,
                  m.body_truncated, m.complete, list(m.trailers)]
        fields += [m.method, m.target] if hasattr(m, "method") else [m.status, m.reason, list(m.informational)]
        headers = m.headers
        if hasattr(headers, "content_length"):
            fields += [headers.content_length, headers.transfer_coding]
        return tuple(repr(f) for f in fields)

    return (message(exchange.request), message(exchange.response), exchange.kind, exchange.outcome,
            exchange.abandoned_ns, exchange.reports_progress, exchange.protocol, exchange.correlation_key)


def canonical_session_events(events: list) -> list[tuple]:
    """Each event: its type, the exchange's position among those seen, progress details;
    then every exchange as it ended up (they are mutated as the session goes on)."""
    positions: dict[int, int] = {}
    exchanges: list = []
    out = []
    for event in events:
        exchange = event.exchange
        if id(exchange) not in positions:
            positions[id(exchange)] = len(exchanges)
            exchanges.append(exchange)
        index = positions[id(exchange)]
        if type(event) is ExchangeProgress:
            out.append(("progress", index, event.phase, event.ts_ns, event.data))
        else:
            out.append((type(event).__name__, index))
    out += [canonical_exchange(exchange) for exchange in exchanges]
    return out


# -- golden captures ----------------------------------------------------------------------------------


@pytest.mark.parametrize("perspective", ["both", "server", "client"])
@pytest.mark.parametrize("capture", CASES, ids=[f"{c.parent.name}/{c.stem}" for c in CASES])
def test_golden_captures_give_the_same_spans_and_metrics(capture: Path, perspective: str) -> None:
    reference, _ = replay_spans(capture, perspective, fast_path=False)
    counters = Counters()
    fast, _ = replay_spans(capture, perspective, fast_path=True, counters=counters)
    assert canonical_spans(fast) == canonical_spans(reference)
    registry = default_registry(fast_path=False)
    assert metric_points(fast, registry) == metric_points(reference, registry)
    if capture.parent.name == "http1" and perspective == "server" and reference:
        # plain captures never leave it; LLM streams and odd framing go to the reference
        assert counters.get("otelbpf.fastpath.exchanges", "http1") + counters.get("otelbpf.fastpath.handoffs", "http1") > 0


# -- generated conversations -----------------------------------------------------------------------------

METHODS = ["GET", "GET", "POST", "PUT", "HEAD", "DELETE", "OPTIONS", "PATCH", "CONNECT", "BREW", "get"]
TARGETS = ["/", "/items/42?x=1", "/v1/chat/completions", "http://h:8/a", "/caf\xe9", "*", "/a b"]
REQUEST_FIELDS = [
    "Host: example.com:8080", "User-Agent: curl/8", "Accept: */*", "X-Odd:  spaced  ", "Connection: keep-alive",
    "Upgrade: websocket", "Expect: 100-continue", "traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    " folded continuation", "NoColonHere", ":empty-name", "Content-Length: 5, 5", "content-length:  007 ",
    "Transfer-Encoding: gzip", "X-Bin: \x01\x7f\xa0", "Content-Length: x",
]
STATUSES = [200, 200, 201, 204, 304, 404, 500, 100, 101, 302, 199]
REASONS = ["OK", "", "Not Found", " Spaced  Out ", "Caf\xe9", "Tab\there"]
RESPONSE_FIELDS = ["Server: nginx", "Date: today", "Content-Type: text/plain", " folded", "Set-Cookie: a=b", "Content-Length: 2, 3"]


PLAIN_METHODS = ["GET", "POST", "PUT", "DELETE", "HEAD"]
PLAIN_TARGETS = ["/", "/items/42?x=1", "/v1/chat/completions", "/static/app.js"]
PLAIN_FIELDS = ["Host: example.com:8080", "User-Agent: curl/8", "Accept: */*", "X-Odd:  spaced  ", "Server: nginx"]


@st.composite
def http_message(draw, request: bool) -> bytes:
    """One request or response: mostly of the plain shape the fast path takes, else odd
    (framed by Content-Length, chunked, or nothing; malformed lines; odd methods)."""
    if draw(st.integers(0, 9)) < 8:
        return draw(plain_message(request))
    if request:
        line = f"{draw(st.sampled_from(METHODS))} {draw(st.sampled_from(TARGETS))} HTTP/1.{draw(st.sampled_from('110'))}"
        pool = REQUEST_FIELDS
    else:
        line = f"HTTP/1.{draw(st.sampled_from('110'))} {draw(st.sampled_from(STATUSES))}"
        reason = draw(st.sampled_from(REASONS))
        line += f" {reason}" if reason or draw(st.booleans()) else ""
        pool = RESPONSE_FIELDS
    fields = draw(st.lists(st.sampled_from(pool), max_size=4))
    body = draw(st.binary(max_size=40))
    framing = draw(st.sampled_from(["length", "length", "chunked", "none", "wrong-length"]))
    if framing == "length":
        fields.append(f"Content-Length: {len(body)}")
    elif framing == "wrong-length":
        fields.append(f"Content-Length: {len(body) + draw(st.integers(1, 5))}")
    elif framing == "chunked":
        fields.append("Transfer-Encoding: chunked")
        body = (f"{len(body):x}\r\n".encode() + body + b"\r\n" if body else b"") + b"0\r\n\r\n"
    elif request:
        body = b""
    lead = draw(st.sampled_from([b"", b"", b"", b"\r\n"]))
    head = "\r\n".join([line, *fields]).encode("latin-1")
    return lead + head + b"\r\n\r\n" + body


@st.composite
def plain_message(draw, request: bool) -> bytes:
    fields = draw(st.lists(st.sampled_from(PLAIN_FIELDS), max_size=3))
    body = draw(st.binary(max_size=24))
    if request:
        line = f"{draw(st.sampled_from(PLAIN_METHODS))} {draw(st.sampled_from(PLAIN_TARGETS))} HTTP/1.1"
        if not body and draw(st.booleans()):
            return ("\r\n".join([line, *fields]) + "\r\n\r\n").encode()
    else:
        status = draw(st.sampled_from([200, 201, 204, 304, 404, 500]))
        line = f"HTTP/1.1 {status} {draw(st.sampled_from(['OK', 'Whatever']))}"
        if status in (204, 304):  # no body, whatever the fields say (a HEAD's answer is cut below)
            return ("\r\n".join([line, *fields]) + "\r\n\r\n").encode()
    fields.append(f"Content-Length: {len(body)}")
    return ("\r\n".join([line, *fields]) + "\r\n\r\n").encode() + body


@st.composite
def conversation(draw) -> list[tuple[Direction, bytes]]:
    """Requests and responses in wire order: mostly request then response, sometimes
    pipelined, sometimes a stray response, a 1xx first, or garbage."""
    out: list[tuple[Direction, bytes]] = []
    for _ in range(draw(st.integers(1, 8))):
        shape = draw(st.sampled_from(["pair", "pair", "pair", "pair", "pair", "pipelined", "stray", "interim", "garbage", "unanswered"]))
        if shape == "pair":
            out += [(IN, draw(http_message(True))), (OUT, draw(http_message(False)))]
        elif shape == "pipelined":
            out += [(IN, draw(http_message(True))), (IN, draw(http_message(True)))]
            out += [(OUT, draw(http_message(False))), (OUT, draw(http_message(False)))]
        elif shape == "stray":
            out.append((OUT, draw(http_message(False))))
        elif shape == "interim":
            out += [(IN, draw(http_message(True))), (OUT, b"HTTP/1.1 100 Continue\r\n\r\n"), (OUT, draw(http_message(False)))]
        elif shape == "garbage":
            out.append((draw(st.sampled_from([IN, OUT])), draw(st.binary(min_size=1, max_size=30))))
        else:
            out.append((IN, draw(http_message(True))))
    return out


@st.composite
def cut_events(draw, messages: list[tuple[Direction, bytes]]) -> list[tuple[Direction, bytes, int]]:
    """The messages as captured reads and writes: whole, split anywhere, glued to the
    next one of the same direction, or with a tail the capture missed."""
    events: list[tuple[Direction, bytes, int]] = []
    for direction, payload in messages:
        if events and events[-1][0] == direction and not events[-1][2] and draw(st.integers(0, 4)) == 0:
            events[-1] = (direction, events[-1][1] + payload, 0)  # one read held both
            continue
        split = draw(st.integers(0, 3)) == 0
        cuts = sorted(draw(st.lists(st.integers(1, max(1, len(payload) - 1)), max_size=2, unique=True))) if split else []
        head_end = payload.find(b"\r\n\r\n") + 4
        if 4 <= head_end < len(payload) and draw(st.integers(0, 3)) == 0:  # head and body written apart
            cuts = sorted({*cuts, head_end})
        pieces = [payload[a:b] for a, b in zip([0, *cuts], [*cuts, len(payload)]) if payload[a:b]]
        for piece in pieces:
            missing = 0
            if len(piece) > 1 and draw(st.integers(0, 7)) == 0:  # the capture kept a prefix only
                missing = draw(st.integers(1, min(len(piece) - 1, 32)))  # mostly a body's tail
                piece = piece[:-missing]
            events.append((direction, piece, missing))
    return events


def _llm_only(exchange) -> bool:
    return exchange.request.target.startswith("/v1/")


def _sessions(progress: bool):
    options = dict(body_limit=16, report_progress=progress, progress_filter=_llm_only if progress else None)
    return fastpath.FastHttp1Detector(**options), Http1Detector(**options)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_sessions_report_the_same_exchanges_for_any_cut(data) -> None:
    messages = data.draw(conversation())
    events = data.draw(cut_events(messages))
    direction = data.draw(st.sampled_from([IN, OUT]))  # which way requests go: server or client side
    flip = (lambda d: d) if direction == IN else (lambda d: d.opposite)
    fast_detector, reference_detector = _sessions(progress=data.draw(st.booleans()))
    fast, reference = fast_detector.new_session(direction), reference_detector.new_session(direction)
    seen_fast, seen_reference = [], []
    for ts, (d, payload, missing) in enumerate(events, start=1):
        seen_fast += fast.feed(flip(d), payload, ts * 10, missing)
        seen_reference += reference.feed(flip(d), payload, ts * 10, missing)
        assert fast.parse_errors == reference.parse_errors
    seen_fast += fast.close(10_000)
    seen_reference += reference.close(10_000)
    assert canonical_session_events(seen_fast) == canonical_session_events(seen_reference)
    assert fast.parse_errors == reference.parse_errors


def _gateway_events(events: list[tuple[Direction, bytes, int]]) -> list:
    """A gateway (pid 200) serving the generated conversation on connection 2 and, in the
    window of each request it reads whole, calling a backend (pid 300) on connection 3;
    its client (pid 100) is traced too, on connection 1, with its own cuts."""
    out: list = [
        ConnOpen(1, 100, 100, 6, 1, socket.AF_INET, "127.0.0.1", 40000, "127.0.0.1", 8081, RoleHint.CONNECTED),
        ConnOpen(1, 200, 200, 5, 2, socket.AF_INET, "127.0.0.1", 8081, "127.0.0.1", 40000, RoleHint.ACCEPTED),
        ConnOpen(1, 200, 200, 7, 3, socket.AF_INET, "127.0.0.1", 40002, "127.0.0.1", 9000, RoleHint.CONNECTED),
        ConnOpen(1, 300, 300, 5, 4, socket.AF_INET, "127.0.0.1", 9000, "127.0.0.1", 40002, RoleHint.ACCEPTED),
    ]
    ts = 1000

    def add(pid: int, conn_id: int, direction: Direction, payload: bytes, missing: int = 0) -> None:
        nonlocal ts
        ts += 10
        out.append(DataEvent(ts, pid, pid, 5, conn_id, direction, len(payload) + missing, payload))

    downstream = (b"GET /backend HTTP/1.1\r\nHost: backend:9000\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    for direction, payload, missing in events:
        add(100, 1, direction.opposite, payload, missing)  # the client wrote what the gateway read, and the reverse
        add(200, 2, direction, payload, missing)
        if direction == IN:
            add(200, 3, OUT, downstream[0])
            add(300, 4, IN, downstream[0])
            add(300, 4, OUT, downstream[1])
            add(200, 3, IN, downstream[1])
    return out


def _pipeline_spans(events: list, fast_path: bool) -> tuple[list, Counters]:
    collected: list = []

    class Collect:
        def on_end(self, span) -> None:
            collected.append(span)

    counters = Counters()
    resources = ProcessResources(describe=lambda pid, comm: {"service.name": f"p{pid}"})
    pipeline = Pipeline(Collect(), resources, counters, registry=default_registry(fast_path=fast_path))
    genai.attach(pipeline)
    middle = len(events) // 2
    pipeline.handle(events[:middle])
    pipeline.handle(events[middle:])
    pipeline.finish()
    return collected, counters


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_pipelines_give_the_same_spans_for_any_cut(data) -> None:
    events = _gateway_events(data.draw(cut_events(data.draw(conversation()))))
    reference, reference_counters = _pipeline_spans(events, fast_path=False)
    fast, _ = _pipeline_spans(events, fast_path=True)
    assert canonical_spans(fast) == canonical_spans(reference)
    registry = default_registry(fast_path=False)
    assert metric_points(fast, registry) == metric_points(reference, registry)


# -- used, and counted ----------------------------------------------------------------------------------

REQUEST = b"GET /index.html HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: wrk\r\n\r\n"
RESPONSE = b"HTTP/1.1 200 OK\r\nServer: nginx\r\nContent-Type: text/html\r\nContent-Length: 612\r\n\r\n" + b"x" * 612


def test_plain_traffic_stays_on_the_fast_path_and_its_share_is_counted() -> None:
    """Keep-alive GETs, a POST with a body, HEAD, 204 and a response whose body the capture
    cut short: all on the fast path. Then a chunked response goes to the reference and the
    connection comes back after it."""
    post = b"POST /submit HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\nabcd"
    exchanges = [
        (REQUEST, RESPONSE, 0),
        (post, b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n", 0),
        (b"HEAD / HTTP/1.1\r\nHost: h\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 612\r\n\r\n", 0),
        (b"DELETE /x/1 HTTP/1.1\r\nHost: h\r\n\r\n", b"HTTP/1.1 204 No Content\r\n\r\n", 0),
        (REQUEST, RESPONSE[:200], len(RESPONSE) - 200),
    ]
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    events: list = [ConnOpen(1, 200, 200, 5, 2, socket.AF_INET, "127.0.0.1", 8080, "127.0.0.1", 40000, RoleHint.ACCEPTED)]
    ts = 100
    for request, response, missing in exchanges + [(REQUEST, chunked, 0), (REQUEST, RESPONSE, 0)]:
        events.append(DataEvent(ts, 200, 200, 5, 2, IN, len(request), request))
        events.append(DataEvent(ts + 5, 200, 200, 5, 2, OUT, len(response) + missing, response))
        ts += 10
    spans, counters = _pipeline_spans(events, fast_path=True)
    reference, _ = _pipeline_spans(events, fast_path=False)
    assert canonical_spans(spans) == canonical_spans(reference) and len(spans) == 7
    assert counters.get("otelbpf.fastpath.exchanges", "http1") == 6  # all but the chunked one
    assert counters.get("otelbpf.fastpath.handoffs", "http1") == 1
    assert [s.attributes["http.response.status_code"] for s in spans] == [200, 201, 200, 204, 200, 200, 200]
    assert spans[4].attributes.get("otelbpf.payload.truncated") is True


def test_the_fast_path_can_be_turned_off(monkeypatch) -> None:
    monkeypatch.setenv(fastpath.ENV, "0")
    assert type(default_registry().detectors()[1]) is Http1Detector
    monkeypatch.delenv(fastpath.ENV)
    fastpath.set_enabled(False)
    try:
        assert type(default_registry().detectors()[1]) is Http1Detector
    finally:
        fastpath.set_enabled(True)


def test_generated_conversations_exercise_both_paths() -> None:
    """The differential tests above mean something only if their inputs reach both the
    fast path and the reference, and cross between them often."""
    totals = {"exchanges": 0, "handoffs": 0}

    @settings(max_examples=200, derandomize=True, deadline=None, database=None)
    @given(st.data())
    def run(data) -> None:
        events = data.draw(cut_events(data.draw(conversation())))
        detector = fastpath.FastHttp1Detector(body_limit=16)
        session = detector.new_session(IN)
        for ts, (direction, payload, missing) in enumerate(events, start=1):
            session.feed(direction, payload, ts, missing)
        exchanges, handoffs = detector.counts.take()
        totals["exchanges"] += exchanges
        totals["handoffs"] += handoffs

    run()
    assert totals["exchanges"] >= 40 and totals["handoffs"] >= 40, totals


def _apart(response: bytes, *at: int) -> list[bytes]:
    """``response`` as a server that writes its head, then its body in pieces, sends it."""
    head_end = response.index(b"\r\n\r\n") + 4
    cuts = [0, head_end, *(head_end + n for n in at), len(response)]
    return [response[a:b] for a, b in zip(cuts, cuts[1:]) if response[a:b]]


def test_a_body_written_apart_from_its_head_stays_on_the_fast_path() -> None:
    """Python's http.server (and many frameworks) write a response's head and body in two
    calls: the fast path follows the body across events, as the reference's parser does."""
    events: list = [ConnOpen(1, 200, 200, 5, 2, socket.AF_INET, "127.0.0.1", 8080, "127.0.0.1", 40000, RoleHint.ACCEPTED)]
    ts = 100
    for pieces in (_apart(RESPONSE), _apart(RESPONSE, 100, 300), _apart(RESPONSE, 612)):
        events.append(DataEvent(ts, 200, 200, 5, 2, IN, len(REQUEST), REQUEST))
        for n, piece in enumerate(pieces, start=1):
            events.append(DataEvent(ts + n, 200, 200, 5, 2, OUT, len(piece), piece))
        ts += 10
    spans, counters = _pipeline_spans(events, fast_path=True)
    reference, _ = _pipeline_spans(events, fast_path=False)
    assert canonical_spans(spans) == canonical_spans(reference) and len(spans) == 3
    assert counters.get("otelbpf.fastpath.exchanges", "http1") == 3
    assert counters.get("otelbpf.fastpath.handoffs", "http1") == 0
    assert [s.end_ns - s.start_ns for s in spans] == [2, 4, 2]  # from the request to the body's last piece


#: (direction, bytes, missing) after the request: a body written apart, then what may happen to it.
MID_BODY = {
    "cut short by a new response": [(OUT, RESPONSE[:200], 0), (OUT, RESPONSE, 0)],
    "a gap in the body": [(OUT, RESPONSE[:150], 0), (OUT, RESPONSE[150:300], 100), (OUT, RESPONSE[400:], 0)],
    "a gap past the body": [(OUT, RESPONSE[:150], 0), (OUT, RESPONSE[150:300], 5000)],
    "bytes after the body": [(OUT, RESPONSE[:150], 0), (OUT, RESPONSE[150:] + b"HTTP/1.1 200 OK\r\n\r\n", 0)],
    "a request before the body ends": [(OUT, RESPONSE[:150], 0), (IN, REQUEST, 0), (OUT, RESPONSE[150:], 0), (OUT, RESPONSE, 0)],
    "the connection closes": [(OUT, RESPONSE[:150], 0), (OUT, RESPONSE[150:400], 0)],
    "a body past the kept limit": [(OUT, RESPONSE[:90], 0), (OUT, RESPONSE[90:95], 0), (OUT, RESPONSE[95:], 0)],
    "an empty read": [(OUT, RESPONSE[:150], 0), (OUT, b"", 0), (OUT, RESPONSE[150:], 0)],
}


@pytest.mark.parametrize("case", list(MID_BODY))
@pytest.mark.parametrize("progress", [False, True])
def test_in_the_middle_of_a_body_the_reference_takes_over_where_it_stands(case: str, progress: bool) -> None:
    """Whatever the fast path does not take in the middle of a body (a gap, a piece that
    could start a new response, bytes past the body, a request, the close) is the
    reference's, from the state its own parser would be in: the same exchanges."""
    fast_detector, reference_detector = _sessions(progress)
    fast, reference = fast_detector.new_session(IN), reference_detector.new_session(IN)
    seen_fast, seen_reference = [], []
    for ts, (direction, payload, missing) in enumerate([(IN, REQUEST, 0), *MID_BODY[case]], start=1):
        seen_fast += fast.feed(direction, payload, ts * 10, missing)
        seen_reference += reference.feed(direction, payload, ts * 10, missing)
        assert fast.parse_errors == reference.parse_errors
    seen_fast += fast.close(10_000)
    seen_reference += reference.close(10_000)
    assert canonical_session_events(seen_fast) == canonical_session_events(seen_reference)
    assert seen_fast, "no exchange at all"
    # the body's first piece was the fast path's; then it handed over in the middle (but for the
    # kept limit, which it follows itself)
    assert fast_detector.counts.take() == ((1, 0) if case == "a body past the kept limit" else (0, 1))


def test_pure_modules_leave_the_fast_path_off_with_the_reason() -> None:
    """OTELBPF_PURE=1 runs the reference modules as plain Python; the fast path, built
    against their compiled types, is then off and says why (it used to fail the import
    of the registry with Cython's "size changed" error)."""
    code = (
        "from otelbpf import fastpath\n"
        "from otelbpf.registry import default_registry\n"
        "print(fastpath.available(), type(default_registry().detectors()[1]).__name__)\n"
        "print(fastpath.UNAVAILABLE)\n"
    )
    env = {**os.environ, "OTELBPF_PURE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    available, detector = out.stdout.splitlines()[0].split()
    assert (available, detector) == ("False", "Http1Detector")
    assert "does not match the reference modules imported" in out.stdout.splitlines()[1]


def test_doctor_says_when_the_fast_path_cannot_load() -> None:
    env = {**os.environ, "OTELBPF_PURE": "1"}
    out = subprocess.run([sys.executable, "-m", "otelbpf", "doctor"], env=env, capture_output=True, text=True, timeout=120)
    line = next(line for line in out.stdout.splitlines() if "] fast path" in line)
    assert line.lstrip().startswith("[warn]") and "reference parsers only" in line and "OTELBPF_PURE=1" in line, out.stdout
    ok = subprocess.run([sys.executable, "-m", "otelbpf", "doctor"], capture_output=True, text=True, timeout=120)
    assert re.search(r"\[  ok\] fast path\s+HTTP/1 on the compiled fast path", ok.stdout), ok.stdout


@pytest.mark.ebpf
def test_the_agent_says_once_at_start_up_that_the_fast_path_cannot_load() -> None:
    """A stale build or OTELBPF_PURE=1: a warning and the self-metric, not silence."""
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        env = {**os.environ, "OTELBPF_PURE": "1"}
        out = subprocess.run(
            [sys.executable, "-m", "otelbpf", "run", "--pid", str(sleeper.pid), "--duration", "1", "--stats-interval", "0.5",
             "--json-file", os.devnull, "--no-profiles"],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        sleeper.kill()
    assert out.returncode == 0, out.stderr[-2000:]
    warnings = [line for line in out.stderr.splitlines() if "HTTP/1 through the reference parsers only" in line]
    assert len(warnings) == 1 and "OTELBPF_PURE=1" in warnings[0], out.stderr[-2000:]
    assert '"otelbpf.fastpath.unavailable": 1' in out.stderr, out.stderr[-2000:]
