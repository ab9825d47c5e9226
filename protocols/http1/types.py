"""HTTP/1.x messages and exchanges, as the parser and stitcher produce them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class HttpMessageBase:
    version: str = "1.1"  # "1.0" or "1.1"
    #: Header fields in order; names lower-cased, values latin-1 decoded and stripped.
    headers: list[tuple[str, str]] = field(default_factory=list)
    start_ns: int = 0  # timestamp of the chunk holding the first byte
    head_end_ns: int = 0  # timestamp of the chunk that completed the head
    end_ns: int = 0  # timestamp of the chunk holding the last byte
    #: Body length in bytes as it crossed the socket (decoded length for chunked),
    #: counting bytes that were not captured.
    body_size: int = 0
    #: Captured prefix of the (de-chunked) body, at most the parser's body_limit.
    body: bytes = b""
    #: Some body bytes were never seen (capture size, sendfile, gaps).
    body_truncated: bool = False
    #: False when the message ended without its framing being satisfied
    #: (connection closed mid-body, body length unknown and never ended, ...).
    complete: bool = True
    #: Trailer fields of a chunked body, like ``headers``.
    trailers: list[tuple[str, str]] = field(default_factory=list)

    def header(self, name: str) -> str | None:
        """First value of header ``name`` (lower-case), or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None


@dataclass(slots=True)
class HttpRequest(HttpMessageBase):
    method: str = ""
    target: str = ""  # request-target as sent: path with query, or absolute-form


@dataclass(slots=True)
class HttpResponse(HttpMessageBase):
    status: int = 0
    reason: str = ""
    #: Status codes of interim 1xx responses that preceded this one.
    informational: list[int] = field(default_factory=list)


@dataclass(slots=True)
class HttpExchange:
    """One request and its response, from one side of one connection."""

    request: HttpRequest
    response: HttpResponse | None = None
    #: Why the exchange ended: "complete", "connection_closed" (closed before
    #: the response finished), "response_missing" (a later response or the
    #: stream's end left it unanswered), "evicted" (too many outstanding).
    end_reason: str = "complete"
    protocol: str = "http/1.1"
    #: When the stitcher gave up on the exchange ("connection_closed": the
    #: close's timestamp; "evicted": the timestamp of the request that pushed
    #: it out); 0 when its response ended it. Lets a span end at the moment
    #: the exchange was abandoned rather than when its request ended.
    abandoned_ns: int = 0

    @property
    def start_ns(self) -> int:
        return self.request.start_ns

    @property
    def end_ns(self) -> int:
        """Last byte of the response; for an abandoned exchange, when it was
        given up (the wait for an answer is part of its duration)."""
        end = max(self.request.end_ns, self.abandoned_ns)
        if self.response is not None:
            end = max(end, self.response.end_ns)
        return end
