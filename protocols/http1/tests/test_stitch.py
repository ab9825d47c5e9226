"""Http1Session: pairing requests with responses into exchanges."""

from __future__ import annotations

import pytest

from protocols.base import Direction, ExchangeAbandoned, ExchangeCompleted, ExchangeProgress, ExchangeStarted, Phase, SessionEvent
from protocols.http1.stitch import Http1Session
from protocols.http1.tests.messages import (
    CHUNKED_RESPONSE,
    CONTINUE,
    CURL_GET,
    HEAD_REQUEST,
    HTTP10_CLOSE_DELIMITED,
    HTTP10_GET,
    KEEP_ALIVE_REQUESTS,
    KEEP_ALIVE_RESPONSES,
    NGINX_200,
    NGINX_HEAD_200,
    NO_CONTENT,
    NOT_MODIFIED,
    REQUESTS_POST,
    body_of,
    split_at,
)
from protocols.http1.types import HttpExchange, HttpResponse

SERVER = Direction.INGRESS  # a server reads requests
IN, OUT = Direction.INGRESS, Direction.EGRESS


def started(events: list[SessionEvent]) -> list[HttpExchange]:
    return [e.exchange for e in events if isinstance(e, ExchangeStarted)]


def ended(events: list[SessionEvent]) -> list[HttpExchange]:
    return [e.exchange for e in events if isinstance(e, (ExchangeCompleted, ExchangeAbandoned))]


def lifecycle(events: list[SessionEvent]) -> list[SessionEvent]:
    """The start and end events (progress left out)."""
    return [e for e in events if not isinstance(e, ExchangeProgress)]


def response_of(exchange: HttpExchange) -> HttpResponse:
    assert exchange.response is not None
    return exchange.response


def test_server_side_exchange_starts_at_the_request_head_and_ends_with_the_response() -> None:
    session = Http1Session(SERVER)
    [start] = lifecycle(session.feed(IN, CURL_GET, 10))
    assert isinstance(start, ExchangeStarted) and start.exchange.response is None
    [end] = lifecycle(session.feed(OUT, NGINX_200, 20))
    assert isinstance(end, ExchangeCompleted) and end.exchange is start.exchange
    exchange = end.exchange
    assert exchange.request.target == "/v1/models?limit=10"
    assert exchange.response is not None and exchange.response.status == 200
    assert (exchange.outcome, exchange.protocol, exchange.request.version) == ("complete", "http1", "1.1")
    assert (exchange.start_ns, exchange.end_ns) == (10, 20)
    assert session.parse_errors == 0 and session.protocol == "http1"


def test_client_side_requests_are_written_and_responses_read() -> None:
    session = Http1Session(Direction.EGRESS)
    assert len(started(session.feed(OUT, HTTP10_GET, 1))) == 1
    session.feed(IN, HTTP10_CLOSE_DELIMITED, 2)
    [exchange] = ended(session.close(3))
    assert exchange.request.version == "1.0"
    assert exchange.outcome == "complete" and response_of(exchange).complete
    assert response_of(exchange).body == b"first part, "
    assert exchange.abandoned_ns == 0


def test_exchange_starts_before_a_slow_request_body_arrives() -> None:
    head, body = REQUESTS_POST.split(b"\r\n\r\n", 1)
    session = Http1Session(SERVER)
    [exchange] = started(session.feed(IN, head + b"\r\n\r\n", 1))
    assert exchange.request.body_size == 0
    assert lifecycle(session.feed(IN, body, 2)) == []
    assert exchange.request.body == body and exchange.request.end_ns == 2


def test_pipelined_requests_pair_in_order_and_the_head_response_has_no_body() -> None:
    session = Http1Session(SERVER)
    exchanges = started(session.feed(IN, CURL_GET + HEAD_REQUEST + REQUESTS_POST, 1))
    assert [e.request.method for e in exchanges] == ["GET", "HEAD", "POST"]
    done = ended(session.feed(OUT, NGINX_200 + NGINX_HEAD_200 + NO_CONTENT, 2))
    assert done == exchanges
    assert [(response_of(e).status, response_of(e).body_size) for e in done] == [
        (200, len(body_of(NGINX_200))),
        (200, 0),
        (204, 0),
    ]
    assert session.parse_errors == 0


def test_keep_alive_conversation_split_anywhere_gives_the_same_exchanges() -> None:
    def run(cut_requests: int, cut_responses: int) -> list[tuple[object, ...]]:
        session = Http1Session(SERVER)
        events: list[SessionEvent] = []
        for chunk in split_at(KEEP_ALIVE_REQUESTS, [cut_requests]):
            events += session.feed(IN, chunk, 1)
        for chunk in split_at(KEEP_ALIVE_RESPONSES, [cut_responses]):
            events += session.feed(OUT, chunk, 2)
        assert session.parse_errors == 0
        return [
            (e.request.target, e.request.body, response_of(e).status, response_of(e).body, e.outcome)
            for e in ended(events)
        ]

    expected = run(0, 0)
    assert [row[2] for row in expected] == [200, 200, 200, 200, 304]
    for cut in range(len(KEEP_ALIVE_REQUESTS) + 1):
        assert run(cut, cut % (len(KEEP_ALIVE_RESPONSES) + 1)) == expected, cut
    for cut in range(len(KEEP_ALIVE_RESPONSES) + 1):
        assert run(0, cut) == expected, cut


def test_expect_100_continue_does_not_end_the_exchange() -> None:
    head, body = REQUESTS_POST.split(b"\r\n\r\n", 1)
    session = Http1Session(SERVER)
    session.feed(IN, head.replace(b"\r\nAccept: */*", b"\r\nExpect: 100-continue") + b"\r\n\r\n", 1)
    assert session.feed(OUT, CONTINUE, 2) == []
    [progress] = session.feed(IN, body, 3)
    assert isinstance(progress, ExchangeProgress) and (progress.phase, progress.data) == (Phase.REQUEST_BODY, body)
    [exchange] = ended(session.feed(OUT, NGINX_200, 4))
    assert response_of(exchange).informational == [100]
    assert exchange.request.body == body


def test_response_without_a_request_is_an_error_and_dropped() -> None:
    session = Http1Session(SERVER)
    assert session.feed(OUT, NGINX_200, 1) == []
    assert session.parse_errors == 1
    [start] = started(session.feed(IN, CURL_GET, 2))
    [end] = ended(session.feed(OUT, NO_CONTENT, 3))
    assert end is start and response_of(end).status == 204


def test_requests_beyond_max_pending_evict_the_oldest() -> None:
    session = Http1Session(SERVER, max_pending=2)
    session.feed(IN, CURL_GET + HEAD_REQUEST, 1)
    events = session.feed(IN, REQUESTS_POST, 2)
    [new] = started(events)
    [evicted] = ended(events)
    assert evicted.request.method == "GET" and new.request.method == "POST"
    assert (evicted.outcome, evicted.abandoned_ns, evicted.response) == ("evicted", 2, None)
    # The HEAD request is now the oldest: its answer must be framed without a body.
    done = ended(session.feed(OUT, NGINX_HEAD_200 + NGINX_200, 3))
    assert [(e.request.method, response_of(e).body_size) for e in done] == [
        ("HEAD", 0),
        ("POST", len(body_of(NGINX_200))),
    ]


def test_close_mid_response_body_ends_the_exchange_as_connection_closed() -> None:
    session = Http1Session(SERVER)
    session.feed(IN, CURL_GET, 1)
    session.feed(OUT, NGINX_200[:-10], 2)
    [exchange] = ended(session.close(3))
    assert (exchange.outcome, exchange.abandoned_ns) == ("connection_closed", 3)
    assert exchange.response is not None and not exchange.response.complete


def test_close_with_unanswered_requests_ends_them_all() -> None:
    session = Http1Session(SERVER)
    session.feed(IN, CURL_GET + HEAD_REQUEST + REQUESTS_POST[:-5], 1)
    done = ended(session.close(9))
    assert [(e.request.method, e.response, e.outcome) for e in done] == [
        ("GET", None, "connection_closed"),
        ("HEAD", None, "connection_closed"),
        ("POST", None, "connection_closed"),
    ]
    assert not done[2].request.complete


def test_lost_sync_in_a_response_body_still_ends_its_exchange() -> None:
    session = Http1Session(SERVER, progress=False)
    session.feed(IN, CURL_GET, 1)
    cut = CHUNKED_RESPONSE.index(b"token1")  # inside the first chunk's data
    [exchange] = ended(session.feed(OUT, CHUNKED_RESPONSE[:cut], 2, missing=500))
    assert exchange.outcome == "complete"
    assert exchange.response is not None and not exchange.response.complete
    assert session.parse_errors == 1


def test_body_sent_by_splice_is_abandoned_when_the_next_response_starts() -> None:
    session = Http1Session(SERVER)
    session.feed(IN, CURL_GET + CURL_GET, 1)
    session.feed(OUT, b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n", 2)
    first, second = ended(session.feed(OUT, NOT_MODIFIED, 3))
    assert response_of(first).body_truncated and not response_of(first).complete
    assert response_of(second).status == 304
    assert session.parse_errors == 0


@pytest.mark.parametrize(
    ("request_bytes", "response_head", "tunnel_bytes"),
    [
        (
            b"GET /chat HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
            b"\x81\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x58",
        ),
        (
            b"CONNECT api.openai.com:443 HTTP/1.1\r\nHost: api.openai.com:443\r\n\r\n",
            b"HTTP/1.1 200 Connection established\r\n\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
        ),
    ],
    ids=["websocket-upgrade", "connect-tunnel"],
)
def test_after_an_upgrade_or_tunnel_the_connection_is_ignored(
    request_bytes: bytes, response_head: bytes, tunnel_bytes: bytes
) -> None:
    session = Http1Session(SERVER)
    session.feed(IN, request_bytes, 1)
    [exchange] = ended(session.feed(OUT, response_head, 2))
    assert exchange.outcome == "complete"
    for ts in range(3, 10):
        assert session.feed(IN if ts % 2 else OUT, tunnel_bytes, ts, missing=100) == []
    assert session.feed(IN, CURL_GET, 10) == []
    assert session.close(11) == []
    assert session.parse_errors == 0


def test_parse_errors_sum_both_parsers_and_orphan_responses() -> None:
    session = Http1Session(SERVER)
    session.feed(IN, b"\x16\x03\x01 garbage\r\n\r\n", 1)  # request parser: 1
    session.feed(OUT, b"\x00\x01 junk\r\n\r\n", 2)  # response parser: 1
    session.feed(OUT, NO_CONTENT, 3)  # no request for it: 1
    assert session.parse_errors == 3


def test_progress_reports_first_response_byte_and_every_body_chunk_with_its_time() -> None:
    session = Http1Session(SERVER, body_limit=0)
    [exchange] = started(session.feed(IN, CURL_GET, 1))
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    events = session.feed(OUT, head, 5)
    events += session.feed(OUT, b"7\r\ndata: a\r\n", 6)
    events += session.feed(OUT, b"7\r\ndata: b\r\n0\r\n\r\n", 9)
    progress = [(e.phase, e.ts_ns, e.data) for e in events if isinstance(e, ExchangeProgress)]
    assert progress == [
        (Phase.RESPONSE_START, 5, b""),
        (Phase.RESPONSE_BODY, 6, b"data: a"),
        (Phase.RESPONSE_BODY, 9, b"data: b"),
    ]
    assert all(e.exchange is exchange for e in events)
    assert ended(events) == [exchange] and response_of(exchange).body == b""  # nothing kept


def test_progress_follows_the_filter_per_exchange_whatever_a_feed_of_response_bytes_holds() -> None:
    """Response body pieces are made only while an exchange the bytes may
    answer reports progress; which exchanges report stays the filter's choice."""
    session = Http1Session(SERVER, body_limit=0, progress_filter=lambda e: e.request.target == "/stream")
    requests = [b"GET /plain HTTP/1.1\r\nHost: h\r\n\r\n", b"GET /stream HTTP/1.1\r\nHost: h\r\n\r\n"]
    first, second, third = (started(session.feed(IN, requests[i % 2], i))[0] for i in range(3))
    plain = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"
    streamed = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\ndef"
    events = session.feed(OUT, plain, 10)  # answers /plain: nothing reports
    events += session.feed(OUT, streamed + plain[:-1], 11)  # /stream whole, then most of the last /plain
    events += session.feed(OUT, plain[-1:], 12)
    pieces = [(e.exchange, e.data) for e in events if isinstance(e, ExchangeProgress) and e.phase == Phase.RESPONSE_BODY]
    assert pieces == [(second, b"def")]
    assert ended(events) == [first, second, third]
    assert [response_of(e).body_size for e in (first, second, third)] == [3, 3, 3]


def test_progress_can_be_left_off_and_then_costs_no_events() -> None:
    session = Http1Session(SERVER, body_limit=0, progress=False)
    events = session.feed(IN, CURL_GET, 1) + session.feed(OUT, NGINX_200, 2)
    assert [type(e) for e in events] == [ExchangeStarted, ExchangeCompleted]
