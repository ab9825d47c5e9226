"""Real-looking HTTP/1.x traffic and helpers shared by the tests."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from protocols.http1.parse import HttpMessage, HttpParser, MessageComplete, ParserEvent
from protocols.http1.types import HttpRequest, HttpResponse

CURL_GET = (
    b"GET /v1/models?limit=10 HTTP/1.1\r\n"
    b"Host: localhost:8000\r\n"
    b"User-Agent: curl/8.5.0\r\n"
    b"Accept: */*\r\n"
    b"\r\n"
)

_JSON_BODY = b'{"model": "llama-3-8b", "prompt": "Hello", "max_tokens": 16}'
REQUESTS_POST = (
    b"POST /v1/completions HTTP/1.1\r\n"
    b"Host: localhost:8000\r\n"
    b"User-Agent: python-requests/2.31.0\r\n"
    b"Accept-Encoding: gzip, deflate\r\n"
    b"Accept: */*\r\n"
    b"Connection: keep-alive\r\n"
    b"Content-Type: application/json\r\n"
    b"Content-Length: " + str(len(_JSON_BODY)).encode() + b"\r\n"
    b"\r\n" + _JSON_BODY
)

CHUNKED_POST = (
    b"POST /upload HTTP/1.1\r\n"
    b"Host: files.internal\r\n"
    b"Transfer-Encoding: chunked\r\n"
    b"Trailer: X-Checksum\r\n"
    b"\r\n"
    b"5;name=value\r\nhello\r\n"
    b"7\r\n, world\r\n"
    b"0\r\n"
    b"X-Checksum: abc123\r\n"
    b"\r\n"
)

HEAD_REQUEST = b"HEAD /static/app.js HTTP/1.1\r\nHost: localhost\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n"

HTTP10_GET = b"GET /index.html HTTP/1.0\r\nUser-Agent: Wget/1.21\r\n\r\n"

#: A keep-alive connection's worth of requests, back to back.
KEEP_ALIVE_REQUESTS = CURL_GET + REQUESTS_POST + CHUNKED_POST + HEAD_REQUEST + HTTP10_GET

_HTML = b"<!DOCTYPE html><html><body><h1>Welcome to nginx!</h1></body></html>\n"
NGINX_200 = (
    b"HTTP/1.1 200 OK\r\n"
    b"Server: nginx/1.24.0\r\n"
    b"Date: Sat, 22 Nov 2025 14:28:00 GMT\r\n"
    b"Content-Type: text/html\r\n"
    b"Content-Length: " + str(len(_HTML)).encode() + b"\r\n"
    b"Connection: keep-alive\r\n"
    b"ETag: \"655f2a1c-45\"\r\n"
    b"\r\n" + _HTML
)

NGINX_HEAD_200 = (
    b"HTTP/1.1 200 OK\r\n"
    b"Server: nginx/1.24.0\r\n"
    b"Content-Type: application/javascript\r\n"
    b"Content-Length: 48213\r\n"
    b"\r\n"
)

CHUNKED_RESPONSE = (
    b"HTTP/1.1 200 OK\r\n"
    b"Content-Type: text/event-stream\r\n"
    b"Transfer-Encoding: chunked\r\n"
    b"Trailer: Server-Timing\r\n"
    b"\r\n"
    b"d\r\ndata: token1\n\r\n"
    b"d;ext=1\r\ndata: token2\n\r\n"
    b"0\r\n"
    b"Server-Timing: total;dur=123\r\n"
    b"\r\n"
)

NO_CONTENT = b"HTTP/1.1 204 No Content\r\nServer: nginx/1.24.0\r\n\r\n"
NOT_MODIFIED = b"HTTP/1.1 304 Not Modified\r\nServer: nginx/1.24.0\r\nETag: \"655f2a1c-45\"\r\n\r\n"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
EARLY_HINTS = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload; as=style\r\n\r\n"

#: Python's http.server answering with HTTP/1.0 and no Content-Length: the body ends at close.
HTTP10_CLOSE_DELIMITED = (
    b"HTTP/1.0 200 OK\r\n"
    b"Server: SimpleHTTP/0.6 Python/3.11.2\r\n"
    b"Date: Sat, 22 Nov 2025 14:28:00 GMT\r\n"
    b"Content-type: text/plain\r\n"
    b"\r\n"
    b"first part, "
)

#: Responses to KEEP_ALIVE_REQUESTS, in order (methods GET, POST, POST, HEAD, GET).
KEEP_ALIVE_METHODS = ["GET", "POST", "POST", "HEAD", "GET"]
KEEP_ALIVE_RESPONSES = NGINX_200 + CONTINUE + NGINX_200 + CHUNKED_RESPONSE + NGINX_HEAD_200 + NOT_MODIFIED


def completed(events: Iterable[ParserEvent]) -> list[HttpMessage]:
    """Messages of the MessageComplete events, in order."""
    return [event.message for event in events if isinstance(event, MessageComplete)]


def requests_only(messages: list[HttpMessage]) -> list[HttpRequest]:
    requests = [m for m in messages if isinstance(m, HttpRequest)]
    assert len(requests) == len(messages)
    return requests


def responses_only(messages: list[HttpMessage]) -> list[HttpResponse]:
    responses = [m for m in messages if isinstance(m, HttpResponse)]
    assert len(responses) == len(messages)
    return responses


def feed_all(parser: HttpParser, chunks: Iterable[bytes], close: bool = False) -> list[HttpMessage]:
    """Feed ``chunks`` with timestamps 0, 1, 2, ... and return the completed messages."""
    messages: list[HttpMessage] = []
    for ts, chunk in enumerate(chunks):
        messages += completed(parser.feed(chunk, ts))
    if close:
        messages += completed(parser.close())
    return messages


def parse_requests(chunks: Iterable[bytes], **options: int) -> tuple[list[HttpRequest], HttpParser]:
    parser = HttpParser("request", **options)
    return requests_only(feed_all(parser, chunks)), parser


def parse_responses(
    chunks: Iterable[bytes], methods: Iterable[str] = (), close: bool = False, **options: int
) -> tuple[list[HttpResponse], HttpParser]:
    parser = HttpParser("response", **options)
    for method in methods:
        parser.expect_response_to(method)
    return responses_only(feed_all(parser, chunks, close)), parser


def split_at(data: bytes, positions: Iterable[int]) -> list[bytes]:
    """``data`` cut at each of ``positions`` (sorted, within bounds)."""
    cuts = [0, *positions, len(data)]
    return [data[start:end] for start, end in zip(cuts, cuts[1:])]


def body_of(raw: bytes) -> bytes:
    """What follows the head of the raw message ``raw``."""
    return raw.split(b"\r\n\r\n", 1)[1]


def without_timestamps(message: HttpMessage) -> HttpMessage:
    """A copy with timestamps zeroed, to compare parses fed with different chunking."""
    return replace(message, start_ns=0, head_end_ns=0, end_ns=0)
