"""The HTTP/1 parser's SSE taps (protocols/genai/chunks.py's SseTap, protocols/http1/parse.py's
BodyTap): an LLM call's streamed response read where the parser frames it, without a
progress event per chunk. The spans must be the same as with every chunk reported as a
progress event (``GenAiLayer.body_taps`` off), however the stream is written, read, cut
into records and drains, and wherever the capture loses bytes; and the in-place chunk
classifier must answer as the one it replaces."""

from __future__ import annotations

import json

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from otelbpf.semantics import genai
from protocols.base import Direction
from protocols.genai.chunks import openai_plain_chunk as _openai_plain_chunk, plain_chunk_at as _plain_chunk_at
from protocols.genai.llm import LlmCall
from protocols.http1.parse import BodyData, BodyTap, HttpParser, MessageComplete
from tests.test_pipeline import accepted, connected, data, make_pipeline

IN, OUT = Direction.INGRESS, Direction.EGRESS
CLIENT_PID, SERVER_PID = 100, 200

# -- the in-place classifier ----------------------------------------------------------

FRAGMENTS = [
    b"{", b"}", b"[", b"]", b",", b":", b" ", b"  ", b'"', b'\\"', b"null", b'""', b'"x"', b'"tok "', b"0", b"1",
    b'"choices"', b'"finish_reason"', b'"usage"', b'"tool_calls"', b'"error"', b'"index"', b'"content"',
    b'"text"', b'"reasoning_content"', b'"reasoning"', b'"delta"', b'"id"', b'"stop"', b"nul", b"true",
]


@settings(max_examples=400, deadline=None)
@given(
    body=st.lists(st.sampled_from(FRAGMENTS), max_size=40).map(b"".join),
    brace=st.booleans(),
    before=st.binary(max_size=8),
    after=st.binary(max_size=8),
)
def test_in_place_classifier_answers_as_the_one_it_replaces(body, brace, before, after):
    chunk = (b"{" + body) if brace else body
    buf = before + chunk + after
    assert _plain_chunk_at(buf, len(before), len(before) + len(chunk)) == _openai_plain_chunk(chunk)


def test_in_place_classifier_on_real_chunks():
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    for separators in ((", ", ": "), (",", ":")):
        for choice in (
            {"index": 0, "delta": {"content": "tok "}, "finish_reason": None},
            {"index": 0, "delta": {"content": ""}, "finish_reason": None},
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None},
            {"index": 0, "delta": {"reasoning_content": "hm"}, "finish_reason": None},
            {"index": 0, "delta": {}, "finish_reason": "stop"},
            {"index": 0, "text": "t", "finish_reason": None},
            {"index": 0, "delta": {"tool_calls": [{"index": 0}]}, "finish_reason": None},
        ):
            chunk = json.dumps({**base, "choices": [choice]}, separators=separators).encode()
            assert _plain_chunk_at(b"xx" + chunk, 2, 2 + len(chunk)) == _openai_plain_chunk(chunk)


class StubCall:
    """What an SseTap asks of its call: ready at once, the chunks it passes on recorded."""

    def __init__(self):
        self.passed = []
        self.counted = 0

    def tap_ready(self, tap):
        return True

    def tapped_event(self, ts_ns, data):
        self.passed.append(data)
        return True

    def tapped(self, chunks, first_ns, last_ns, events):
        self.counted += chunks


BASE = b'{"id": "c-1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "'
END = b'"}, "finish_reason": null}]}'
#: A chunk: its start up to an output string's opening quote, the string's bytes (two parts)
#: and the rest, each picked among shapes that the template reading must tell apart.
WORDS = [b"tok ", b"x", b"", b'"', b"content", b"usage", b"index", b"a\\", b'a"b', b"text", b"\\u0022"]
MORE = [b"", b"tok", b" 2"]
HEADS = [BASE, BASE.replace(b'"c-1"', b'"c-2"'), b'{"choices": [{"delta": {"text": "', BASE.replace(b"content", b"reasoning")]
TAILS = [END, b'"}, "finish_reason": "stop"}]}', b'"}}], "usage": null}', b'"}}]}', b'", "index": 1}]}', b'"']


@settings(max_examples=300, deadline=None)
@given(
    chunks=st.lists(
        st.tuples(st.sampled_from(WORDS), st.sampled_from(MORE), st.sampled_from(HEADS), st.sampled_from(TAILS)),
        min_size=1,
        max_size=12,
    )
)
def test_a_tap_answers_every_chunk_as_the_full_reading_does(chunks):
    """The compiled tap answers a chunk that differs from the last one it scanned only in
    an output string from that one (SseTap._classify): the same answers as reading each."""
    from protocols.genai.chunks import SseTap

    call = StubCall()
    tap = SseTap(call, True, True)
    for n, (word, more, head, tail) in enumerate(chunks):
        payload = head + word + more + tail
        event = b"data: " + payload + b"\n\n"
        passed, counted = len(call.passed), call.counted + tap.chunks
        assert tap.take(event, 0, len(event), n) == len(event)
        expected = _openai_plain_chunk(payload)
        got = (len(call.passed) - passed, call.counted + tap.chunks - counted)
        assert got == {-1: (1, 0), 0: (0, 0), 1: (0, 1)}[expected], payload


def reference_loads(data: bytes):
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)
AFTER_JSON = [b"", b" ", b"\n\r\t", b" x", b"}", b"\x00", b"\xff"]
ODD_JSON = [b"{", b"{\x00", b'{"a": 1}', b'{"a": "\xed\xa0\x80"}', b'{"a": "\\ud800"}', b"{}  \x0c", b'\xef\xbb\xbf{"a":1}']


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=40),
        JSON_VALUES.map(lambda value: json.dumps(value).encode()),
        st.tuples(st.dictionaries(st.text(max_size=4), st.integers()), st.sampled_from(AFTER_JSON)).map(
            lambda pair: json.dumps(pair[0]).encode() + pair[1]
        ),
        st.sampled_from(ODD_JSON),
    )
)
def test_the_json_reader_answers_as_json_loads(data):
    from protocols.genai.jsonutil import loads as _loads

    assert _loads(data) == reference_loads(data)


# -- the parser's side ----------------------------------------------------------------

CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_a_tap_that_takes_nothing_changes_nothing():
    body = [b"5\r\nhello\r\n", b"3\r\nabc\r\n6\r\nde", b"fghi\r\n0\r\n\r\n"]
    runs = []
    for tapped in (False, True):
        parser = HttpParser("response", 0)
        events = parser.feed(CHUNKED, 1)
        if tapped:
            events[0].message.body_tap = BodyTap()
        for ts, piece in enumerate(body, 2):
            events += parser.feed(piece, ts)
        runs.append([(type(e).__name__, getattr(e, "data", None), getattr(e, "ts_ns", None)) for e in events])
    assert runs[0] == runs[1]


class Holder(BodyTap):
    """Takes everything and holds it: the parser must hand it back before what it tells next."""

    def __init__(self):
        self.held = b""

    def take(self, data, start, stop, ts_ns):
        self.held += data[start:stop]
        return stop

    def release(self):
        return (self.held, 7) if self.held else None


def test_what_a_tap_holds_comes_back_before_a_hole_and_before_the_end():
    parser = HttpParser("response", 0)
    message = parser.feed(CHUNKED, 1)[0].message
    message.body_tap = Holder()
    assert parser.feed(b"5\r\nhello\r\n", 2) == []
    events = parser.feed(b"8\r\nabc", 3, missing=5)  # a hole mid-chunk
    assert [(type(e), e.data) for e in events] == [(BodyData, b"helloabc"), (BodyData, None)]
    assert message.body_tap is None  # detached: the rest comes as BodyData
    parser = HttpParser("response", 0)
    message = parser.feed(CHUNKED, 1)[0].message
    message.body_tap = Holder()
    events = parser.feed(b"5\r\nhello\r\n0\r\n\r\n", 2)
    assert [(type(e), getattr(e, "data", None)) for e in events] == [(BodyData, b"hello"), (MessageComplete, None)]


# -- the same spans with and without taps ---------------------------------------------

REQUEST_BODY = json.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "stream_options": {"include_usage": True}}
).encode()
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(REQUEST_BODY), REQUEST_BODY)
)


def chunk_json(choice=None, usage=None, separators=(", ", ": ")) -> str:
    out = {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1, "model": "m-served"}
    out["choices"] = [choice] if choice else []
    if usage:
        out["usage"] = usage
    return json.dumps(out, separators=separators)


def token(i: int) -> bytes:
    return f"data: {chunk_json({'index': 0, 'delta': {'content': f't{i} '}, 'finish_reason': None})}\n\n".encode()


#: SSE events, the plain ones (counted in place) and every shape a tap does not read itself.
ODD_EVENTS = [
    b": keep-alive\n\n",
    b"event: note\ndata: {\"x\": 1}\n\n",
    b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\r\n\r\n',
    b'data:{"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":null}]}\n\n',
    b'data: {"choices": [{"index": 0,\ndata: "delta": {"content": "c"}}]}\n\n',
    b'data: {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0}]}}]}\n\n',
    b'data: {"choices": [{"index": 0, "delta": {"content": "' + b"x" * 70_000 + b'"}}]}\n\n',
    b"data: \n\n",
    b"\n",
]


def stream_events(odd: list[int], tokens: int) -> list[bytes]:
    role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    events = [f"data: {chunk_json(role)}\n\n".encode()]
    for i in range(tokens):
        events.append(token(i))
        for k in odd:
            if k % max(tokens, 1) == i:
                events.append(ODD_EVENTS[k % len(ODD_EVENTS)])
    events.append(f"data: {chunk_json({'index': 0, 'delta': {}, 'finish_reason': 'length'})}\n\n".encode())
    events.append(f"data: {chunk_json(usage={'prompt_tokens': 3, 'completion_tokens': tokens})}\n\n".encode())
    events.append(b"data: [DONE]\n\n")
    return events


def chunked(events: list[bytes], per_chunk: list[int]) -> bytes:
    """The events in HTTP chunks: ``per_chunk`` cycles through how many events go in each
    (0: the next event split across two chunks)."""
    out, i, n = [], 0, 0
    while i < len(events):
        k = per_chunk[n % len(per_chunk)] if per_chunk else 1
        n += 1
        if k == 0:
            event = events[i]
            half = len(event) // 2
            out += [event[:half], event[half:]]
            i += 1
            continue
        out.append(b"".join(events[i : i + k]))
        i += k
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in out if c) + b"0\r\n\r\n"


def records(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % max(len(stream), 1) for c in cuts} - {0})
    edges = [0, *points, len(stream)]
    return [stream[a:b] for a, b in zip(edges, edges[1:])]


def spans_of(server_records, client_records, batch: int, lose: set[int], taps: bool, max_calls: int | None = None):
    """Both sides through a pipeline with GenAI (taps on or off): the server writes its
    records, the client reads its own; ``lose``: records whose second half the capture
    lost; events handled ``batch`` at a time. Returns {kind: (name, attributes)} and how
    many response-body progress events the GenAI layer saw."""
    pipeline, out, _ = make_pipeline()
    layer = genai.attach(pipeline)
    layer.body_taps = taps
    if max_calls is not None:
        layer.max_calls = max_calls
    seen = {"body": 0}
    # Body pieces that reached the calls as progress events (not read by a tap): counted where
    # the layer hands them on (wrapping the observer would make it not the only one: no taps).
    response_body = LlmCall.response_body

    def counting(call, ts_ns, data):
        seen["body"] += 1
        response_body(call, ts_ns, data)

    LlmCall.response_body = counting
    try:
        return _spans_of(pipeline, out, server_records, client_records, batch, lose), seen["body"]
    finally:
        LlmCall.response_body = response_body


def _spans_of(pipeline, out, server_records, client_records, batch, lose):
    events = [connected(1, CLIENT_PID, local_port=40000, peer_port=8000), accepted(2, SERVER_PID, local_port=8000, peer_port=40000)]
    events += [data(10, 1, CLIENT_PID, OUT, REQUEST, fd=6), data(11, 2, SERVER_PID, IN, REQUEST)]
    ts = 20
    # The client reads bytes once the server wrote them: each read just after the write of its last byte.
    written, ends = 0, []
    for rec in server_records:
        written += len(rec)
        ends.append(written)
    timeline, read = [], 0
    for n, rec in enumerate(server_records):
        timeline.append((2 * n, 2, SERVER_PID, OUT, 5, n, rec))
    for n, rec in enumerate(client_records):
        read += len(rec)
        after = next((i for i, end in enumerate(ends) if end >= read), len(ends) - 1)
        timeline.append((2 * after + 1, 1, CLIENT_PID, IN, 6, n, rec))
    for order, conn, pid, direction, fd, n, rec in sorted(timeline, key=lambda t: t[0]):
        ts += 1
        event = data(ts, conn, pid, direction, rec, fd=fd)
        if n in lose and len(rec) > 1:
            event.data = rec[: len(rec) // 2]
        events.append(event)
    for i in range(0, len(events), batch):
        pipeline.handle(events[i : i + batch])
    pipeline.finish()
    return {span.kind: (span.name, dict(span.attributes)) for span in out.spans}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tokens=st.integers(0, 40),
    odd=st.lists(st.integers(0, 200), max_size=4),
    per_chunk=st.lists(st.integers(0, 4), max_size=5),
    server_cuts=st.lists(st.integers(0, 10**6), max_size=30),
    client_cuts=st.lists(st.integers(0, 10**6), max_size=12),
    batch=st.integers(1, 40),
    lose=st.sets(st.integers(0, 30), max_size=2),
)
def test_taps_give_the_spans_every_chunk_as_a_progress_event_gives(tokens, odd, per_chunk, server_cuts, client_cuts, batch, lose):
    body = chunked(stream_events(odd, tokens), per_chunk)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    server = [head, *records(body, server_cuts)]
    client = records(head + body, client_cuts)
    with_taps, _ = spans_of(server, client, batch, lose, True)
    without, _ = spans_of(server, client, batch, lose, False)
    assert with_taps == without


def test_a_stream_a_chunk_per_write_is_read_by_the_taps():
    """The agent's case (bench/llm_stream.py): a chunk per write on the server, 4 KiB reads on
    the client, drains of a few records: no chunk is a progress event, and the facts are the
    ones every chunk as a progress event gives."""
    events = stream_events([], 200)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    server = [head] + [b"%x\r\n%s\r\n" % (len(e), e) for e in events]  # a chunk per write
    server[-1] += b"0\r\n\r\n"
    body = chunked(events, [1])
    assert b"".join(server) == head + body
    client = [head + body[i : i + 4096] if i == 0 else body[i : i + 4096] for i in range(0, len(body), 4096)]
    with_taps, progress = spans_of(server, client, 8, set(), True)
    without, progress_without = spans_of(server, client, 8, set(), False)
    assert with_taps == without
    # The progress filter gave each response its tap before its head was parsed: no chunk is a progress event.
    assert progress_without >= 2 * 204 and progress == 0
    for name, attrs in with_taps.values():
        assert attrs["otelbpf.gen_ai.response.chunks"] == 200 and attrs["gen_ai.usage.output_tokens"] == 200


def test_an_evicted_call_with_a_tap_reads_on_as_without():
    body = chunked(stream_events([3], 30), [1, 2, 0])
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    server = [head, *records(body, list(range(97, 10**6, 211)))]
    client = records(head + body, [1500, 3100])
    # max_calls 1: the client's call and the server's evict each other as their chunks come
    assert spans_of(server, client, 3, set(), True, max_calls=1)[0] == spans_of(server, client, 3, set(), False, max_calls=1)[0]
