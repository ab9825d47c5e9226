"""HTTP/2 streams as exchanges: one request, its response and trailers, per stream."""

from __future__ import annotations

from dataclasses import dataclass, field

from protocols.base import ExchangeKind, Outcome

#: The protocol id (folder, span ``protocol``, counters, golden folder).
PROTOCOL = "http2"

#: The client connection preface (RFC 9113 3.4).
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@dataclass(slots=True)
class Http2Message:
    """One direction of one stream: header block, body, trailers."""

    #: Decoded header fields in order (lower-case names); fields HPACK could not
    #: decode are missing here and counted in ``unknown_fields``.
    headers: list[tuple[str, str]] = field(default_factory=list)
    trailers: list[tuple[str, str]] = field(default_factory=list)
    #: Fields of this message's header blocks that referred to HPACK entries
    #: older than the agent (``otelbpf.http2.hpack_incomplete``).
    unknown_fields: int = 0
    start_ns: int = 0
    end_ns: int = 0
    #: DATA payload bytes (padding excluded), counting bytes not captured.
    body_size: int = 0
    #: Some DATA bytes were not captured.
    body_truncated: bool = False
    #: gRPC length-prefixed messages counted in the DATA (None: framing lost).
    grpc_messages: int | None = 0
    #: END_STREAM seen in this direction.
    ended: bool = False
    #: gRPC framing state: bytes of the current 5-byte prefix, body bytes left.
    grpc_prefix: bytes = b""
    grpc_left: int = 0

    @property
    def grpc_framed(self) -> bool:
        """The DATA was whole gRPC messages (a 0/1 flag, a length, that many bytes), at least one."""
        return bool(self.grpc_messages) and not self.grpc_left and not self.grpc_prefix

    def header(self, name: str) -> str | None:
        """First value of ``name`` (lower-case) among headers, then trailers."""
        for key, value in self.headers:
            if key == name:
                return value
        for key, value in self.trailers:
            if key == name:
                return value
        return None


@dataclass(slots=True)
class Http2Exchange:
    """One HTTP/2 stream seen from one side (an ``Exchange`` of protocols/base.py)."""

    stream_id: int
    request: Http2Message
    response: Http2Message | None = None
    kind: ExchangeKind = ExchangeKind.SERVER
    outcome: Outcome = Outcome.COMPLETE
    protocol: str = PROTOCOL
    abandoned_ns: int = 0
    #: RST_STREAM error code that ended it (None if none), or GOAWAY's code.
    reset_code: int | None = None
    #: Request came through ``Upgrade: h2c`` (HTTP/1.1 head, response on stream 1).
    upgraded: bool = False
    #: The session joined the connection after it started (no preface seen).
    joined_late: bool = False
    #: Whether its session reports its progress (set when it opens, from the
    #: detector's ``progress_filter``; protocols/base.py).
    reports_progress: bool = False

    @property
    def correlation_key(self) -> int:
        """The stream id: both ends of a connection see the same one."""
        return self.stream_id

    @property
    def start_ns(self) -> int:
        return self.request.start_ns

    @property
    def end_ns(self) -> int:
        end = max(self.request.end_ns, self.abandoned_ns)
        if self.response is not None:
            end = max(end, self.response.end_ns)
        return end

    @property
    def hpack_incomplete(self) -> bool:
        """Some header field of the stream could not be decoded (table older than the agent)."""
        response = self.response
        return bool(self.request.unknown_fields or (response is not None and response.unknown_fields))

    def carrier(self) -> list[tuple[str, str]]:
        return self.request.headers
