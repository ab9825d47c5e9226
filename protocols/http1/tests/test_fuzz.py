"""Property tests: any input is survived, and chunking never changes a parse."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols.base import Direction, ExchangeAbandoned, ExchangeCompleted, ExchangeProgress, ExchangeStarted, SessionEvent
from protocols.http1.parse import BodyData, HeadComplete, HttpMessage, HttpParser, MessageComplete, ParserEvent
from protocols.http1.stitch import Http1Session
from protocols.http1.tests.messages import (
    CHUNKED_POST,
    CHUNKED_RESPONSE,
    CONTINUE,
    CURL_GET,
    HTTP10_CLOSE_DELIMITED,
    KEEP_ALIVE_REQUESTS,
    KEEP_ALIVE_RESPONSES,
    NGINX_200,
    NO_CONTENT,
    REQUESTS_POST,
    completed,
    split_at,
    without_timestamps,
)
from protocols.http1.types import HttpRequest, HttpResponse

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

HEAD_LIMIT, BODY_LIMIT, MAX_PENDING = 512, 64, 4

# Pieces of real traffic mixed with junk, so fuzzing reaches heads, bodies and chunk framing.
_FRAGMENTS = [
    CURL_GET,
    REQUESTS_POST,
    CHUNKED_POST,
    NGINX_200,
    CHUNKED_RESPONSE,
    CONTINUE,
    NO_CONTENT,
    HTTP10_CLOSE_DELIMITED,
    b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
    b"CONNECT a:443 HTTP/1.1\r\n\r\n",
    b"HEAD / HTTP/1.1\r\n\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Content-Length: 10\r\n",
    b"\r\n",
    b"\r\n\r\n",
    b"5;x=y\r\nhello\r\n",
    b"0\r\n\r\n",
    b"ffffffff\r\n",
]
_CHUNK = st.one_of(
    st.binary(max_size=300),
    st.sampled_from(_FRAGMENTS),
    st.sampled_from(_FRAGMENTS).flatmap(lambda f: st.integers(0, len(f)).map(lambda cut: f[cut:])),
)
_MISSING = st.one_of(st.just(0), st.just(0), st.integers(0, 5000))
_CHUNKS = st.lists(st.tuples(_CHUNK, _MISSING), max_size=25)


class EventOrder:
    """Checks that a parser reports each message's head, then its body data, then its end, exactly once,
    and that the body data adds up to what was captured of the body."""

    def __init__(self) -> None:
        self.open: HttpMessage | None = None
        self.body_bytes = 0

    def check(self, events: list[ParserEvent]) -> None:
        for event in events:
            if isinstance(event, HeadComplete):
                assert self.open is None
                self.open = event.message
                self.body_bytes = 0
            elif isinstance(event, BodyData):
                assert event.message is self.open and (event.data or event.data is None)  # None: a hole
                self.body_bytes += len(event.data or b"")
                assert self.body_bytes <= event.message.body_size
            else:
                assert isinstance(event, MessageComplete) and event.message is self.open
                self.open = None


@FUZZ
@given(
    kind=st.sampled_from(["request", "response"]),
    chunks=_CHUNKS,
    methods=st.lists(st.sampled_from(["GET", "HEAD", "CONNECT"])),
)
def test_parser_survives_anything_with_bounded_memory(
    kind: str, chunks: list[tuple[bytes, int]], methods: list[str]
) -> None:
    parser = HttpParser(kind, BODY_LIMIT, max_head_size=HEAD_LIMIT)  # type: ignore[arg-type]
    for method in methods:
        parser.expect_response_to(method)
    order = EventOrder()
    for ts, (data, missing) in enumerate(chunks):
        order.check(parser.feed(data, ts, missing))
        assert parser.buffered_bytes <= HEAD_LIMIT + BODY_LIMIT
    order.check(parser.close())
    assert order.open is None


@FUZZ
@given(chunks=st.lists(st.tuples(st.booleans(), _CHUNK, _MISSING), max_size=30))
def test_session_survives_anything_and_ends_every_exchange_it_starts(chunks: list[tuple[bool, bytes, int]]) -> None:
    session = Http1Session(Direction.INGRESS, body_limit=BODY_LIMIT, max_pending=MAX_PENDING)
    open_exchanges: set[int] = set()

    def account(events: list[SessionEvent]) -> None:
        for event in events:
            if isinstance(event, ExchangeStarted):
                open_exchanges.add(id(event.exchange))
            elif isinstance(event, ExchangeProgress):
                assert id(event.exchange) in open_exchanges  # progress only between start and end
            else:
                assert isinstance(event, (ExchangeCompleted, ExchangeAbandoned))
                open_exchanges.remove(id(event.exchange))  # started before, ended once

    for ts, (is_request, data, missing) in enumerate(chunks):
        direction = Direction.INGRESS if is_request else Direction.EGRESS
        account(session.feed(direction, data, ts, missing))
        assert len(open_exchanges) <= MAX_PENDING + 1  # pending plus the one being answered
    account(session.close(len(chunks)))
    assert not open_exchanges


# -- generated valid traffic ------------------------------------------------

_TOKEN_CHARS = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_NAMES = st.text(_TOKEN_CHARS, min_size=1, max_size=12).filter(
    lambda n: n.lower() not in ("content-length", "transfer-encoding")
)
# Latin-1 without spaces, DEL or what str.strip() removes (NEL, NBSP): values survive stripping.
_VALUE_CHARS = st.characters(min_codepoint=0x21, max_codepoint=0xFF, blacklist_characters="\x7f\x85\xa0")
_VALUES = st.text(_VALUE_CHARS, max_size=20)
_HEADERS = st.lists(st.tuples(_NAMES, _VALUES), max_size=6)


@dataclass
class Generated:
    raw: bytes
    #: Expected parse, without timestamps.
    message: HttpMessage
    method: str = "GET"  # for responses: the method of the request answered
    informational: list[int] = field(default_factory=list)


def _head_bytes(start_line: str, headers: list[tuple[str, str]]) -> bytes:
    lines = [start_line, *(f"{name}: {value}" for name, value in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@st.composite
def _body_with_framing(draw: st.DrawFn) -> tuple[list[tuple[str, str]], bytes, list[tuple[str, str]], bytes]:
    """(framing headers, body, trailers, body bytes as sent)."""
    body = draw(st.binary(max_size=200))
    if not draw(st.booleans()):
        return [("Content-Length", str(len(body)))], body, [], body
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=4, unique=True)))
    sent = b""
    for piece in split_at(body, cuts):
        if piece:
            extension = draw(st.sampled_from(["", ";a=b", ';name="v"']))
            sent += f"{len(piece):x}{extension}\r\n".encode() + piece + b"\r\n"
    trailers = draw(_HEADERS)
    sent += b"0\r\n" + _head_bytes("", trailers)[2:]
    return [("Transfer-Encoding", "chunked")], body, [(n.lower(), v) for n, v in trailers], sent


@st.composite
def generated_requests(draw: st.DrawFn) -> Generated:
    method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "PROPFIND"]))
    target = "/" + draw(st.text("abcxyz0123456789-._~/?=&%", max_size=30))
    headers = draw(_HEADERS)
    body, trailers, sent = b"", [], b""
    if draw(st.booleans()):
        framing, body, trailers, sent = draw(_body_with_framing())
        headers = headers + framing
    version = draw(st.sampled_from(["1.0", "1.1"]))
    raw = _head_bytes(f"{method} {target} HTTP/{version}", headers) + sent
    expected = HttpRequest(
        version=version,
        method=method,
        target=target,
        headers=[(n.lower(), v) for n, v in headers],
        body=body[:BODY_LIMIT],
        body_size=len(body),
        trailers=trailers,
    )
    return Generated(raw, expected, method)


@st.composite
def generated_responses(draw: st.DrawFn) -> Generated:
    method = draw(st.sampled_from(["GET", "GET", "POST", "HEAD"]))
    status = draw(st.sampled_from([200, 201, 204, 206, 301, 304, 404, 500, 503]))
    informational = draw(st.lists(st.sampled_from([100, 103]), max_size=2))
    headers = draw(_HEADERS)
    body, trailers, sent = b"", [], b""
    if method == "HEAD" or status in (204, 304):
        if method == "HEAD":
            headers = headers + [("Content-Length", "1234")]
    else:
        framing, body, trailers, sent = draw(_body_with_framing())
        headers = headers + framing
    raw = b"".join(_head_bytes(f"HTTP/1.1 {code} Interim", []) for code in informational)
    raw += _head_bytes(f"HTTP/1.1 {status} Reason Phrase", headers) + sent
    expected = HttpResponse(
        status=status,
        reason="Reason Phrase",
        informational=informational,
        headers=[(n.lower(), v) for n, v in headers],
        body=body[:BODY_LIMIT],
        body_size=len(body),
        trailers=trailers,
    )
    return Generated(raw, expected, method, informational)


def _parse(kind: str, stream: list[Generated], cuts: list[int]) -> tuple[list[HttpMessage], HttpParser]:
    parser = HttpParser(kind, BODY_LIMIT)  # type: ignore[arg-type]
    for generated in stream:
        parser.expect_response_to(generated.method)
    raw = b"".join(g.raw for g in stream)
    messages: list[HttpMessage] = []
    for ts, chunk in enumerate(split_at(raw, sorted(set(c % (len(raw) + 1) for c in cuts)))):
        messages += completed(parser.feed(chunk, ts))
    return [without_timestamps(m) for m in messages], parser


@FUZZ
@given(
    kind_and_stream=st.one_of(
        st.tuples(st.just("request"), st.lists(generated_requests(), min_size=1, max_size=4)),
        st.tuples(st.just("response"), st.lists(generated_responses(), min_size=1, max_size=4)),
    ),
    cuts=st.lists(st.integers(0, 10_000), max_size=10),
)
def test_valid_stream_parses_to_the_generated_messages_however_it_is_split(
    kind_and_stream: tuple[str, list[Generated]], cuts: list[int]
) -> None:
    kind, stream = kind_and_stream
    whole, parser = _parse(kind, stream, [])
    assert whole == [g.message for g in stream]
    assert parser.parse_errors == 0
    split, parser = _parse(kind, stream, cuts)
    assert split == whole
    assert parser.parse_errors == 0


@FUZZ
@given(
    stream=st.sampled_from([KEEP_ALIVE_REQUESTS, KEEP_ALIVE_RESPONSES]),
    edits=st.lists(st.tuples(st.integers(0, 2000), st.binary(max_size=3), st.integers(0, 3)), min_size=1, max_size=5),
    cuts=st.lists(st.integers(0, 2000), max_size=8),
)
def test_corrupted_real_traffic_never_raises(
    stream: bytes, edits: list[tuple[int, bytes, int]], cuts: list[int]
) -> None:
    data = bytearray(stream)
    for position, replacement, removed in edits:
        position %= len(data) + 1
        data[position : position + removed] = replacement
    corrupted = bytes(data)
    for kind in ("request", "response"):
        parser = HttpParser(kind, BODY_LIMIT, max_head_size=HEAD_LIMIT)  # type: ignore[arg-type]
        order = EventOrder()
        for ts, chunk in enumerate(split_at(corrupted, sorted({c % (len(corrupted) + 1) for c in cuts}))):
            order.check(parser.feed(chunk, ts))
        order.check(parser.close())
        assert order.open is None
