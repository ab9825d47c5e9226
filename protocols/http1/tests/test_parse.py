"""HttpParser: framing, chunking, gaps, resync and limits on real-looking traffic."""

from __future__ import annotations

import itertools

import pytest

from protocols.http1.parse import (
    BodyData,
    MAX_HEAD_SIZE,
    HeadComplete,
    HttpParser,
    MessageComplete,
    looks_like_request_start,
    looks_like_response_start,
)
from protocols.http1.tests.messages import (
    CHUNKED_POST,
    CHUNKED_RESPONSE,
    CONTINUE,
    CURL_GET,
    EARLY_HINTS,
    HEAD_REQUEST,
    HTTP10_CLOSE_DELIMITED,
    HTTP10_GET,
    KEEP_ALIVE_METHODS,
    KEEP_ALIVE_REQUESTS,
    KEEP_ALIVE_RESPONSES,
    NGINX_200,
    NGINX_HEAD_200,
    NO_CONTENT,
    NOT_MODIFIED,
    REQUESTS_POST,
    body_of,
    completed,
    parse_requests,
    parse_responses,
    requests_only,
    responses_only,
    split_at,
    without_timestamps,
)
from protocols.http1.types import HttpRequest, HttpResponse


def framing(events: list[ParserEvent]) -> list[ParserEvent]:
    """The head and end events (body data left out)."""
    return [e for e in events if not isinstance(e, BodyData)]

# -- requests ---------------------------------------------------------------


def test_curl_get_is_parsed_with_ordered_lowercase_headers() -> None:
    [request], parser = parse_requests([CURL_GET])
    assert isinstance(request, HttpRequest)
    assert (request.method, request.target, request.version) == ("GET", "/v1/models?limit=10", "1.1")
    assert request.headers == [("host", "localhost:8000"), ("user-agent", "curl/8.5.0"), ("accept", "*/*")]
    assert (request.body, request.body_size, request.complete, request.body_truncated) == (b"", 0, True, False)
    assert parser.parse_errors == 0


def test_header_values_are_latin1_stripped_and_duplicates_kept_in_order() -> None:
    head = b"GET / HTTP/1.1\r\nCookie:  a=1 \r\nX-Name:\tcaf\xe9\t\r\nCOOKIE: b=2\r\n\r\n"
    [request], _ = parse_requests([head])
    assert request.headers == [("cookie", "a=1"), ("x-name", "caf\u00e9"), ("cookie", "b=2")]
    assert request.header("cookie") == "a=1"


def test_content_length_body_is_captured() -> None:
    [request], _ = parse_requests([REQUESTS_POST])
    assert request.method == "POST"
    assert request.body == b'{"model": "llama-3-8b", "prompt": "Hello", "max_tokens": 16}'
    assert request.body_size == len(request.body)
    assert request.header("content-type") == "application/json"


def test_chunked_body_with_extensions_and_trailers() -> None:
    [request], parser = parse_requests([CHUNKED_POST])
    assert request.body == b"hello, world"
    assert request.body_size == 12
    assert request.trailers == [("x-checksum", "abc123")]
    assert request.complete and parser.parse_errors == 0


def test_keep_alive_stream_yields_every_request_in_order() -> None:
    messages, parser = parse_requests([KEEP_ALIVE_REQUESTS])
    assert [(m.method, m.target, m.version) for m in messages] == [
        ("GET", "/v1/models?limit=10", "1.1"),
        ("POST", "/v1/completions", "1.1"),
        ("POST", "/upload", "1.1"),
        ("HEAD", "/static/app.js", "1.1"),
        ("GET", "/index.html", "1.0"),
    ]
    assert parser.parse_errors == 0


def test_every_single_split_point_gives_the_same_requests() -> None:
    expected, _ = parse_requests([KEEP_ALIVE_REQUESTS])
    expected = [without_timestamps(m) for m in expected]
    for cut in range(len(KEEP_ALIVE_REQUESTS) + 1):
        messages, parser = parse_requests(split_at(KEEP_ALIVE_REQUESTS, [cut]))
        assert [without_timestamps(m) for m in messages] == expected, cut
        assert parser.parse_errors == 0


def test_every_pair_of_split_points_in_a_chunked_message_gives_the_same_request() -> None:
    [expected], _ = parse_requests([CHUNKED_POST])
    for first, second in itertools.combinations(range(1, len(CHUNKED_POST)), 2):
        messages, parser = parse_requests(split_at(CHUNKED_POST, [first, second]))
        assert [without_timestamps(m) for m in messages] == [without_timestamps(expected)], (first, second)
        assert parser.parse_errors == 0


def test_every_single_split_point_gives_the_same_responses() -> None:
    expected, _ = parse_responses([KEEP_ALIVE_RESPONSES], methods=KEEP_ALIVE_METHODS)
    assert [m.status for m in expected] == [200, 200, 200, 200, 304]
    expected = [without_timestamps(m) for m in expected]
    for cut in range(len(KEEP_ALIVE_RESPONSES) + 1):
        messages, parser = parse_responses(
            split_at(KEEP_ALIVE_RESPONSES, [cut]), methods=KEEP_ALIVE_METHODS
        )
        assert [without_timestamps(m) for m in messages] == expected, cut
        assert parser.parse_errors == 0


def test_one_byte_chunks_give_the_same_requests() -> None:
    expected, _ = parse_requests([KEEP_ALIVE_REQUESTS])
    messages, _ = parse_requests([bytes([b]) for b in KEEP_ALIVE_REQUESTS])
    assert [without_timestamps(m) for m in messages] == [without_timestamps(m) for m in expected]


def test_pipelined_requests_in_one_chunk_produce_paired_events_in_order() -> None:
    parser = HttpParser("request")
    events = framing(parser.feed(CURL_GET + REQUESTS_POST + HEAD_REQUEST, 5))
    assert [type(e) for e in framing(events)] == [HeadComplete, MessageComplete] * 3
    assert [e.message.method for e in events[::2]] == ["GET", "POST", "HEAD"]
    assert all(head.message is done.message for head, done in zip(events[::2], events[1::2]))


def test_head_is_reported_before_the_body_arrives() -> None:
    head, body = REQUESTS_POST.split(b"\r\n\r\n", 1)
    parser = HttpParser("request")
    [started] = parser.feed(head + b"\r\n\r\n", 1)
    assert isinstance(started, HeadComplete) and started.message.body_size == 0
    [data, finished] = parser.feed(body, 2)
    assert isinstance(data, BodyData) and (data.data, data.ts_ns) == (body, 2) and data.message is started.message
    assert isinstance(finished, MessageComplete) and finished.message is started.message
    assert finished.message.body == body


def test_body_data_is_reported_in_full_with_each_chunk_time_whatever_is_kept() -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"d\r\ndata: token1\n\r\n"
    )
    last = b"5a\r\n" + b"data: " + b"x" * 82 + b"\n\n" + b"\r\n0\r\n\r\n"
    parser = HttpParser("response", body_limit=4)
    events = parser.feed(chunked, 1) + parser.feed(last, 2)
    pieces = [(e.data, e.ts_ns) for e in events if isinstance(e, BodyData)]
    assert pieces == [(b"data: token1\n", 1), (b"data: " + b"x" * 82 + b"\n\n", 2)]
    [done] = completed(events)
    assert done.body == b"data" and done.body_size == 13 + 90  # kept: the consumer's 4 bytes

@pytest.mark.parametrize("body_limit", [0, 4, 65536])
def test_without_body_events_the_same_messages_come_with_no_body_pieces(body_limit: int) -> None:
    """A consumer that reads no body pieces turns them off: only BodyData goes."""
    stream = NGINX_200 + CHUNKED_RESPONSE + NGINX_200
    chunks = split_at(stream, [7, len(NGINX_200) + 40, len(NGINX_200) + len(CHUNKED_RESPONSE) - 3])
    with_pieces, without = HttpParser("response", body_limit), HttpParser("response", body_limit, body_events=False)
    events = [e for i, c in enumerate(chunks) for e in with_pieces.feed(c, i)]
    bare = [e for i, c in enumerate(chunks) for e in without.feed(c, i)]
    assert any(isinstance(e, BodyData) for e in events) and not any(isinstance(e, BodyData) for e in bare)
    assert completed(bare) == completed(events)
    assert [(m.body, m.body_size, m.end_ns) for m in completed(bare)] == [
        (m.body, m.body_size, m.end_ns) for m in completed(events)
    ]
    assert [type(e) for e in bare] == [type(e) for e in framing(events)]


def test_timestamps_follow_the_chunks_holding_first_head_end_and_last_bytes() -> None:
    head_end = REQUESTS_POST.index(b"\r\n\r\n") + 4
    chunks = split_at(REQUESTS_POST, [10, head_end - 1, head_end + 5])
    [request], _ = parse_requests(chunks)  # timestamps 0, 1, 2, 3
    assert (request.start_ns, request.head_end_ns, request.end_ns) == (0, 2, 3)


def test_bodyless_request_ends_where_its_head_ends() -> None:
    parser = HttpParser("request")
    parser.feed(CURL_GET[:20], 100)
    [request] = completed(parser.feed(CURL_GET[20:], 200))
    assert (request.start_ns, request.head_end_ns, request.end_ns) == (100, 200, 200)


def test_body_beyond_body_limit_is_counted_but_not_kept() -> None:
    [request], parser = parse_requests([REQUESTS_POST[:-20], REQUESTS_POST[-20:]], body_limit=10)
    assert request.body == b'{"model": '
    assert request.body_size == len(body_of(REQUESTS_POST))
    assert not request.body_truncated and request.complete
    assert parser.buffered_bytes == 0


def test_leading_blank_lines_between_messages_are_skipped_even_when_split() -> None:
    messages, parser = parse_requests([CURL_GET + b"\r", b"\n\r\n" + HEAD_REQUEST])
    assert [m.method for m in messages] == ["GET", "HEAD"]
    assert messages[1].start_ns == 1
    assert parser.parse_errors == 0


def test_obsolete_line_folding_joins_the_continuation() -> None:
    head = b"GET / HTTP/1.1\r\nX-Long: first\r\n  second\r\nHost: a\r\n\r\n"
    [request], parser = parse_requests([head])
    assert request.headers == [("x-long", "first second"), ("host", "a")]
    assert parser.parse_errors == 0


def test_header_line_without_colon_is_counted_and_skipped() -> None:
    head = b"GET / HTTP/1.1\r\nHost: a\r\nthis is not a header\r\nAccept: */*\r\n\r\n"
    [request], parser = parse_requests([head])
    assert request.headers == [("host", "a"), ("accept", "*/*")]
    assert parser.parse_errors == 1


@pytest.mark.parametrize(
    "content_length", [b"abc", b"-1", b"+5", b"1 2", b"\xb2", b"5, 6", b"1" * 40], ids=repr
)
def test_invalid_content_length_drops_the_request(content_length: bytes) -> None:
    bad = b"POST /x HTTP/1.1\r\nContent-Length: " + content_length + b"\r\n\r\nhello"
    messages, parser = parse_requests([bad, CURL_GET])
    assert [m.target for m in messages] == ["/v1/models?limit=10"]
    assert parser.parse_errors == 1


def test_repeated_identical_content_lengths_are_accepted() -> None:
    request = b"POST /x HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5, 5\r\n\r\nhello"
    [message], parser = parse_requests([request])
    assert message.body == b"hello" and parser.parse_errors == 0


def test_transfer_encoding_takes_precedence_over_content_length() -> None:
    request = (
        b"POST /x HTTP/1.1\r\nContent-Length: 100\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
        b"3\r\nabc\r\n0\r\n\r\n"
    )
    messages, parser = parse_requests([request + CURL_GET])
    assert [(m.target, m.body) for m in messages] == [("/x", b"abc"), ("/v1/models?limit=10", b"")]
    assert parser.parse_errors == 0


def test_request_with_unknown_final_coding_is_an_error() -> None:
    request = b"POST /x HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\nxxxx"
    messages, parser = parse_requests([request])
    assert messages == [] and parser.parse_errors == 1


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # TLS ClientHello
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",  # HTTP/2 preface
        b"GET /a b HTTP/1.1\r\n\r\n",  # space in target
        b"GET / HTTP/2\r\n\r\n",
        b"\x00" * 100 + b"\r\n\r\n",
    ],
    ids=repr,
)
def test_garbage_is_counted_then_the_next_message_start_resyncs(garbage: bytes) -> None:
    messages, parser = parse_requests([garbage, b"more garbage\r\n\r\n", CURL_GET])
    assert [m.method for m in messages] == ["GET"]
    assert parser.parse_errors == 1


def test_head_larger_than_the_limit_is_an_error_and_memory_stays_bounded() -> None:
    parser = HttpParser("request")
    parser.feed(b"GET / HTTP/1.1\r\n", 0)
    for ts in range(1, 100):
        parser.feed(b"X-Filler: " + b"a" * 1000 + b"\r\n", ts)
        assert parser.buffered_bytes <= MAX_HEAD_SIZE
    assert parser.parse_errors == 1
    assert requests_only(completed(parser.feed(CURL_GET, 100)))[0].target == "/v1/models?limit=10"


def test_too_many_headers_is_an_error() -> None:
    head = b"GET / HTTP/1.1\r\n" + b"X-A: 1\r\n" * 257 + b"\r\n"
    messages, parser = parse_requests([head])
    assert messages == [] and parser.parse_errors == 1
    [request], parser = parse_requests([b"GET / HTTP/1.1\r\n" + b"X-A: 1\r\n" * 256 + b"\r\n"])
    assert len(request.headers) == 256 and parser.parse_errors == 0


# -- responses --------------------------------------------------------------


def test_nginx_response_with_content_length() -> None:
    [response], parser = parse_responses([NGINX_200], methods=["GET"])
    assert isinstance(response, HttpResponse)
    assert (response.status, response.reason, response.version) == (200, "OK", "1.1")
    assert response.body.startswith(b"<!DOCTYPE html>") and response.body_size == len(response.body)
    assert response.header("etag") == '"655f2a1c-45"'


def test_response_to_head_has_no_body_despite_content_length() -> None:
    messages, parser = parse_responses([NGINX_HEAD_200 + NGINX_200], methods=["HEAD", "GET"])
    assert [(m.status, m.body_size) for m in messages] == [(200, 0), (200, len(messages[1].body))]
    assert parser.parse_errors == 0


def test_response_without_known_request_is_framed_like_a_get() -> None:
    messages, _ = parse_responses([NGINX_200 + NO_CONTENT])
    assert [m.status for m in messages] == [200, 204]
    assert messages[0].body_size > 0


@pytest.mark.parametrize("bodyless", [NO_CONTENT, NOT_MODIFIED], ids=["204", "304"])
def test_204_and_304_have_no_body(bodyless: bytes) -> None:
    messages, parser = parse_responses([bodyless + NGINX_200], methods=["GET", "GET"])
    assert [m.body_size for m in messages] == [0, len(body_of(NGINX_200))]
    assert parser.parse_errors == 0


def test_interim_responses_are_recorded_on_the_final_one() -> None:
    parser = HttpParser("response")
    parser.expect_response_to("POST")
    assert parser.feed(CONTINUE, 1) == []
    assert parser.feed(EARLY_HINTS, 2) == []
    events = parser.feed(NGINX_200, 3)
    assert [type(e) for e in framing(events)] == [HeadComplete, MessageComplete]
    response = events[0].message
    assert isinstance(response, HttpResponse)
    assert (response.status, response.informational, response.start_ns) == (200, [100, 103], 3)


def test_101_switching_protocols_is_final_and_makes_the_stream_opaque() -> None:
    switching = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
    parser = HttpParser("response")
    parser.expect_response_to("GET")
    events = parser.feed(switching + b"\x81\x05hello", 1)
    assert [type(e) for e in framing(events)] == [HeadComplete, MessageComplete]
    assert events[1].message.status == 101
    assert parser.opaque
    assert parser.feed(b"\x81\x7e\x00\x80" + b"x" * 128, 2, missing=4096) == []
    assert parser.feed(NGINX_200, 3) == [] and parser.close() == []
    assert parser.parse_errors == 0


def test_connect_2xx_turns_the_stream_into_a_tunnel() -> None:
    parser = HttpParser("response")
    parser.expect_response_to("CONNECT")
    [head, done] = parser.feed(b"HTTP/1.1 200 Connection established\r\n\r\n", 1)
    assert done.message.status == 200 and parser.opaque
    assert parser.feed(b"\x16\x03\x03\x00\x7a\x02\x00\x00\x76\x03\x03", 2) == []
    assert parser.parse_errors == 0


def test_connect_refused_is_an_ordinary_response() -> None:
    refused = b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 4\r\n\r\nnope"
    messages, parser = parse_responses([refused + NO_CONTENT], methods=["CONNECT", "GET"])
    assert [(m.status, m.body) for m in messages] == [(407, b"nope"), (204, b"")]
    assert not parser.opaque


def test_http10_response_without_length_is_delimited_by_close() -> None:
    parser = HttpParser("response")
    parser.expect_response_to("GET")
    assert [type(e) for e in framing(parser.feed(HTTP10_CLOSE_DELIMITED, 1))] == [HeadComplete]
    assert framing(parser.feed(b"second part", 2)) == []
    [response] = completed(parser.close())
    assert isinstance(response, HttpResponse)
    assert response.body == b"first part, second part"
    assert response.complete and response.version == "1.0"
    assert (response.head_end_ns, response.end_ns) == (1, 2)


def test_response_with_unknown_coding_is_delimited_by_close() -> None:
    gzip_only = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n\x1f\x8b\x08"
    [response], parser = parse_responses([gzip_only], methods=["GET"], close=True)
    assert response.body == b"\x1f\x8b\x08" and response.complete


def test_chunked_response_with_trailers() -> None:
    [response], parser = parse_responses([CHUNKED_RESPONSE], methods=["GET"])
    assert response.body == b"data: token1\ndata: token2\n"
    assert response.trailers == [("server-timing", "total;dur=123")]
    assert parser.parse_errors == 0


def test_chunked_body_split_inside_the_crlf_after_data() -> None:
    cut = CHUNKED_RESPONSE.index(b"token1\n") + len(b"token1\n") + 1  # between \r and \n
    [response], parser = parse_responses(split_at(CHUNKED_RESPONSE, [cut]))
    assert response.body == b"data: token1\ndata: token2\n" and parser.parse_errors == 0


# -- gaps (missing bytes), resync and the splice heuristic ------------------


def test_missing_bytes_inside_a_body_advance_it_and_mark_it_truncated() -> None:
    head, body = NGINX_200.split(b"\r\n\r\n", 1)
    parser = HttpParser("response")
    parser.feed(head + b"\r\n\r\n" + body[:10], 1, missing=len(body) - 10 - 5)
    [response] = completed(parser.feed(body[-5:], 2))
    assert response.body_size == len(body)
    assert response.body == body[:10] + body[-5:]
    assert response.body_truncated and response.complete and response.end_ns == 2
    assert parser.parse_errors == 0


def test_body_completed_by_missing_bytes_ends_at_that_chunk() -> None:
    head, body = NGINX_200.split(b"\r\n\r\n", 1)
    parser = HttpParser("response")
    parser.feed(head + b"\r\n\r\n", 1)
    [response] = completed(parser.feed(body[:4], 2, missing=len(body) - 4))
    assert (response.end_ns, response.body_size, response.body_truncated) == (2, len(body), True)
    assert [m.status for m in responses_only(completed(parser.feed(NO_CONTENT, 3)))] == [204]


def test_missing_bytes_past_the_body_lose_sync_until_a_message_start() -> None:
    parser = HttpParser("response")
    [response] = completed(parser.feed(NGINX_200[:-3], 1, missing=3 + 40))  # the next head's start is lost
    assert response.complete and response.body_truncated
    assert parser.parse_errors == 1
    assert parser.feed(NO_CONTENT[40:], 2) == []  # the rest of the lost head is discarded
    assert [m.status for m in responses_only(completed(parser.feed(NOT_MODIFIED, 3)))] == [304]
    assert parser.parse_errors == 1


def test_missing_bytes_in_a_head_drop_it_and_resync() -> None:
    parser = HttpParser("request")
    assert parser.feed(REQUESTS_POST[:30], 1, missing=50) == []
    assert parser.parse_errors == 1
    assert parser.feed(REQUESTS_POST[80:], 2) == []
    assert [m.target for m in requests_only(completed(parser.feed(CURL_GET, 3)))] == ["/v1/models?limit=10"]
    assert parser.parse_errors == 1


def test_missing_bytes_between_messages_lose_sync() -> None:
    parser = HttpParser("request")
    parser.feed(CURL_GET, 1, missing=20)
    assert parser.parse_errors == 1
    assert requests_only(completed(parser.feed(HEAD_REQUEST, 2)))[0].method == "HEAD"


def test_missing_bytes_within_one_chunk_of_a_chunked_body_are_tolerated() -> None:
    cut = CHUNKED_RESPONSE.index(b"data: token1") + 2
    parser = HttpParser("response")
    parser.feed(CHUNKED_RESPONSE[:cut], 1, missing=5)
    [response] = completed(parser.feed(CHUNKED_RESPONSE[cut + 5 :], 2))
    assert response.complete and response.body_truncated
    assert response.body_size == 26 and response.body == b"daoken1\ndata: token2\n"
    assert parser.parse_errors == 0


def test_missing_bytes_over_chunk_framing_end_the_message_incomplete() -> None:
    """Without body events (nobody reads the pieces): lost framing ends the message."""
    cut = CHUNKED_RESPONSE.index(b"data: token1") + 2
    parser = HttpParser("response", body_events=False)
    [_head] = framing(parser.feed(CHUNKED_RESPONSE[:cut], 1))
    [response] = completed(parser.feed(b"", 2, missing=100))
    assert not response.complete and response.body_truncated and response.end_ns == 2
    assert parser.parse_errors == 1
    assert [m.status for m in responses_only(completed(parser.feed(NO_CONTENT, 3)))] == [204]


def test_bad_chunk_size_ends_the_message_incomplete() -> None:
    bad = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n"
    [response], parser = parse_responses([bad], body_events=False)
    assert not response.complete and response.body == b"hello"
    assert parser.parse_errors == 1


def test_missing_crlf_after_chunk_data_ends_the_message_incomplete() -> None:
    bad = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n"
    [response], parser = parse_responses([bad], body_events=False)
    assert not response.complete and parser.parse_errors == 1


def test_body_that_skipped_capture_is_abandoned_when_a_new_response_starts() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: video/mp4\r\nContent-Length: 1048576\r\n\r\n"
    parser = HttpParser("response")
    parser.expect_response_to("GET")
    parser.expect_response_to("GET")
    parser.feed(head, 1)  # the body went out with splice(): never seen
    events = parser.feed(NO_CONTENT, 2)
    assert [type(e) for e in framing(events)] == [MessageComplete, HeadComplete, MessageComplete]
    abandoned, next_response = events[0].message, events[2].message
    assert (abandoned.complete, abandoned.body_truncated, abandoned.end_ns) == (False, True, 1)
    assert next_response.status == 204
    assert parser.parse_errors == 0


@pytest.mark.parametrize(
    "partial",
    [CURL_GET[:40], b"ing the tail of a body whose start was before the capture"],
    ids=["cut-head", "mid-stream-capture"],
)
def test_partial_head_is_dropped_when_a_chunk_starts_a_new_message(partial: bytes) -> None:
    messages, parser = parse_requests([partial, HEAD_REQUEST])
    assert [m.method for m in messages] == ["HEAD"]
    assert messages[0].start_ns == 1
    assert parser.parse_errors == 1


def test_body_bytes_that_merely_contain_a_status_line_are_not_a_new_message() -> None:
    body = b"see HTTP/1.1 200 OK"
    response = b"HTTP/1.1 200 OK\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    [message], parser = parse_responses([response, body])
    assert message.body == body and message.complete


# -- close ------------------------------------------------------------------


def test_close_mid_body_returns_the_partial_message() -> None:
    head, body = REQUESTS_POST.split(b"\r\n\r\n", 1)
    parser = HttpParser("request")
    parser.feed(head + b"\r\n\r\n" + body[:7], 1)
    [request] = completed(parser.close())
    assert not request.complete and request.body == body[:7] and request.end_ns == 1
    assert parser.parse_errors == 0


def test_close_mid_head_counts_an_error_and_returns_nothing() -> None:
    parser = HttpParser("request")
    parser.feed(CURL_GET[:15], 1)
    assert parser.close() == [] and parser.parse_errors == 1


def test_close_between_messages_does_nothing() -> None:
    parser = HttpParser("request")
    parser.feed(CURL_GET, 1)
    assert parser.close() == [] and parser.parse_errors == 0


# -- start-of-message heuristics -------------------------------------------


@pytest.mark.parametrize(
    "data",
    [CURL_GET, HTTP10_GET, b"PROPFIND /dav/ HTTP/1.1\r\n", b"GET /" + b"a" * 100, b"OPTIONS * HTTP/1.1\r\n"],
    ids=repr,
)
def test_request_starts_are_recognised(data: bytes) -> None:
    assert looks_like_request_start(data)


@pytest.mark.parametrize(
    "data",
    [b"PROPFIND /dav/", b"GET foo\r\n", b"GET", b"PRI * HTTP/2.0\r\n", b"HTTP/1.1 200 OK\r\n", b"get\x00/"],
    ids=repr,
)
def test_non_request_starts_are_rejected(data: bytes) -> None:
    assert not looks_like_request_start(data)


def test_response_starts() -> None:
    assert looks_like_response_start(b"HTTP/1.1 200 OK\r\n")
    assert looks_like_response_start(b"HTTP/1.0 404\r\n")
    assert not looks_like_response_start(b"HTTP/2 200\r\n")
    assert not looks_like_response_start(b"HTTP/1.1 2000\r\n")
    assert not looks_like_response_start(b"GET / HTTP/1.1\r\n")


def test_kind_is_validated() -> None:
    with pytest.raises(ValueError):
        HttpParser("both")  # type: ignore[arg-type]
