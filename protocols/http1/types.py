"""HTTP/1.x messages and exchanges, as the parser and stitcher produce them."""

from __future__ import annotations

from dataclasses import dataclass, field

from protocols.base import ExchangeKind, Outcome

#: The protocol id, used everywhere this protocol is named (folder, spans, counters).
PROTOCOL = "http1"


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
    #: Prefix of the (de-chunked) body kept for the consumer: at most the
    #: ``body_limit`` the consumer gave the parser. Every captured body byte
    #: is also reported as a ``BodyData`` event, whatever this keeps.
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
    """One request and its response, from one side of one connection
    (an ``Exchange`` of protocols/base.py)."""

    request: HttpRequest
    response: HttpResponse | None = None
    #: SERVER when the traced process read the request, CLIENT when it wrote it.
    kind: ExchangeKind = ExchangeKind.SERVER
    #: How it ended: COMPLETE, CONNECTION_CLOSED (closed before the response
    #: finished), RESPONSE_MISSING, EVICTED (too many outstanding), or what
    #: the pipeline decided for an exchange its session never ended.
    outcome: Outcome = Outcome.COMPLETE
    protocol: str = PROTOCOL
    #: When the exchange was given up (the close's timestamp; for EVICTED the
    #: timestamp of the request that pushed it out); 0 when its response ended
    #: it. Lets a span end at the moment it was abandoned rather than when its
    #: request ended.
    abandoned_ns: int = 0
    #: HTTP/1.x answers in order: no key, FIFO pairing.
    correlation_key: None = None
    #: Whether its session reports its progress (set at start from the
    #: detector's ``progress_filter``; base.py).
    reports_progress: bool = False

    @property
    def start_ns(self) -> int:
        return self.request.start_ns

    @property
    def end_ns(self) -> int:
        """Last byte of the response; for an abandoned exchange, when it was
        given up (the wait for an answer is part of its duration)."""
        end = self.request.end_ns
        if self.abandoned_ns > end:
            end = self.abandoned_ns
        response = self.response
        if response is not None and response.end_ns > end:
            end = response.end_ns
        return end

    def carrier(self) -> list[tuple[str, str]]:
        """The request's headers: where trace context travels."""
        return self.request.headers
