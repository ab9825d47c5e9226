"""Times the HTTP/1 parser and session on typical traffic (not a test).

Run: .venv/bin/python -m protocols.http1.tests.timing
Prints microseconds per message for a ~200-byte curl GET and a ~150-byte
response with a 50-byte body, each arriving in one chunk as one syscall
would deliver it.
"""

from __future__ import annotations

import timeit

from protocols.base import Direction
from protocols.http1.parse import HttpParser
from protocols.http1.stitch import Http1Session

CURL_GET = (
    b"GET /api/v1/models/llama-3-8b/status?verbose=true HTTP/1.1\r\n"
    b"Host: inference.internal.example.com:8080\r\n"
    b"User-Agent: curl/8.5.0\r\n"
    b"Accept: */*\r\n"
    b"Accept-Encoding: gzip\r\n"
    b"X-Request-Id: 7f9c2ba4e88f827d\r\n"
    b"\r\n"
)
RESPONSE = (
    b"HTTP/1.1 200 OK\r\n"
    b"Server: nginx/1.24.0\r\n"
    b"Content-Type: application/json\r\n"
    b"Content-Length: 50\r\n"
    b"\r\n" + b'{"status":"ready","model":"llama-3-8b","gpus":8}\r\n'
)


def _per_call_us(function: object, number: int) -> float:
    return min(timeit.repeat(function, number=number, repeat=5)) / number * 1e6  # type: ignore[arg-type]


def main() -> None:
    number = 20000
    requests = HttpParser("request")
    responses = HttpParser("response")
    session = Http1Session(Direction.INGRESS)

    def exchange() -> None:
        session.feed(Direction.INGRESS, CURL_GET, 1)
        session.feed(Direction.EGRESS, RESPONSE, 2)

    print(f"request  ({len(CURL_GET)} B): {_per_call_us(lambda: requests.feed(CURL_GET, 1), number):.2f} us")
    print(f"response ({len(RESPONSE)} B): {_per_call_us(lambda: responses.feed(RESPONSE, 2), number):.2f} us")
    print(f"exchange through Http1Session: {_per_call_us(exchange, number):.2f} us")


if __name__ == "__main__":
    main()
