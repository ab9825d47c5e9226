"""HTTP/2 streams as exchanges: one request, its response and trailers, per stream."""

from __future__ import annotations

from dataclasses import dataclass

from protocols.base import ExchangeKind, Outcome

#: The protocol id (folder, span ``protocol``, counters, golden folder).
PROTOCOL = "http2"

#: The client connection preface (RFC 9113 3.4).
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


# Built several times per stream. Written as a dataclass over an explicit ``__init__``
# and ``__slots__`` (fields as bare annotations, defaults in ``__init__``), as
# protocols/http1/types.py does: slotted dataclasses as plain Python (eq, repr,
# ``dataclasses.replace``), extension types with a C ``__init__`` when Cython compiles
# this module (types.pxd declares their fields; a dataclass's generated ``__init__``
# is interpreted code). ``None`` stands for a fresh empty list.


@dataclass
class Http2Message:
    """One direction of one stream: header block, body, trailers."""

    __slots__ = ("headers", "trailers", "unknown_fields", "start_ns", "end_ns", "body_size", "body_truncated",
                 "grpc_messages", "ended", "grpc_prefix", "grpc_left")
    #: Decoded header fields in order (lower-case names); fields HPACK could not
    #: decode are missing here and counted in ``unknown_fields``.
    headers: list[tuple[str, str]]
    trailers: list[tuple[str, str]]
    #: Fields of this message's header blocks that referred to HPACK entries
    #: older than the agent (``otelbpf.http2.hpack_incomplete``).
    unknown_fields: int
    start_ns: int
    end_ns: int
    #: DATA payload bytes (padding excluded), counting bytes not captured.
    body_size: int
    #: Some DATA bytes were not captured.
    body_truncated: bool
    #: gRPC length-prefixed messages counted in the DATA (None: framing lost).
    grpc_messages: int | None
    #: END_STREAM seen in this direction.
    ended: bool
    #: gRPC framing state: bytes of the current 5-byte prefix, body bytes left.
    grpc_prefix: bytes
    grpc_left: int

    def __init__(self, headers=None, trailers=None, unknown_fields=0, start_ns=0, end_ns=0, body_size=0,
                 body_truncated=False, grpc_messages=0, ended=False, grpc_prefix=b"", grpc_left=0) -> None:
        self.headers = [] if headers is None else headers
        self.trailers = [] if trailers is None else trailers
        self.unknown_fields = unknown_fields
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.body_size = body_size
        self.body_truncated = body_truncated
        self.grpc_messages = grpc_messages
        self.ended = ended
        self.grpc_prefix = grpc_prefix
        self.grpc_left = grpc_left

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


@dataclass
class Http2Exchange:
    """One HTTP/2 stream seen from one side (an ``Exchange`` of protocols/base.py)."""

    __slots__ = ("stream_id", "request", "response", "kind", "outcome", "protocol", "abandoned_ns", "reset_code",
                 "upgraded", "joined_late", "reports_progress")
    stream_id: int
    request: Http2Message
    response: Http2Message | None
    kind: ExchangeKind
    outcome: Outcome
    protocol: str
    abandoned_ns: int
    #: RST_STREAM error code that ended it (None if none), or GOAWAY's code.
    reset_code: int | None
    #: Request came through ``Upgrade: h2c`` (HTTP/1.1 head, response on stream 1).
    upgraded: bool
    #: The session joined the connection after it started (no preface seen).
    joined_late: bool
    #: Whether its session reports its progress (set when it opens, from the
    #: detector's ``progress_filter``; protocols/base.py).
    reports_progress: bool

    #: Not a message read by several processes: linked by connection pair (base.py).
    message_key = None

    def __init__(self, stream_id, request, response=None, kind=ExchangeKind.SERVER, outcome=Outcome.COMPLETE,
                 protocol=PROTOCOL, abandoned_ns=0, reset_code=None, upgraded=False, joined_late=False,
                 reports_progress=False) -> None:
        self.stream_id = stream_id
        self.request = request
        self.response = response
        self.kind = kind
        self.outcome = outcome
        self.protocol = protocol
        self.abandoned_ns = abandoned_ns
        self.reset_code = reset_code
        self.upgraded = upgraded
        self.joined_late = joined_late
        self.reports_progress = reports_progress

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
