"""The contract every protocol module keeps.

A protocol module is sans-IO: the agent feeds it the bytes one traced process
read or wrote on one connection (or one datagram at a time), in order, with
timestamps, and gets back session events. It never touches sockets, eBPF or
OpenTelemetry, so it runs the same on live capture, on a pcap file and under
a fuzzer.

Each protocol package (``protocols/http1``, ...) provides:

* a **detector**: given the first bytes seen in one direction, is this me, and
  which direction carries the requests (:class:`Detector`);
* a **parser** per direction: ``feed(data, ts_ns, missing)`` -> messages;
* a **session** (stitcher) that pairs requests with responses into
  exchanges and reports them as :data:`SessionEvent` s (:class:`Session`).

An exchange (:class:`Exchange`) is what becomes one span: a request and its
response, or one message for one-way protocols. Its lifecycle is
``ExchangeStarted`` once, any number of ``ExchangeProgress``, then exactly one
``ExchangeCompleted`` (or ``ExchangeAbandoned``). The agent's pipeline
enforces the "exactly one end": an exchange a session forgets to end is ended
by the pipeline when its connection closes, is evicted or its process exits
(docs/architecture.md, "Exchange lifecycle").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, Protocol, runtime_checkable


class Direction(enum.IntEnum):
    """Which way bytes moved, seen from the traced process."""

    INGRESS = 0  # the process read them (recv/read)
    EGRESS = 1  # the process wrote them (send/write)

    @property
    def opposite(self) -> "Direction":
        return Direction.EGRESS if self is Direction.INGRESS else Direction.INGRESS


class ExchangeKind(enum.IntEnum):
    """The span kind an exchange implies, from the traced process's side.

    Same numbers as OTLP's ``Span.SpanKind`` (and ``otelbpf.core.model.SpanKind``).
    """

    INTERNAL = 1
    SERVER = 2  # the process read the request and wrote the response
    CLIENT = 3  # the process wrote the request and read the response
    PRODUCER = 4  # the process sent a one-way message
    CONSUMER = 5  # the process received a one-way message

    @staticmethod
    def for_request(request_direction: Direction) -> "ExchangeKind":
        """SERVER when requests are read (INGRESS), CLIENT when they are written."""
        return ExchangeKind.SERVER if request_direction == Direction.INGRESS else ExchangeKind.CLIENT


class Outcome(str, enum.Enum):
    """How an exchange ended. The value is what spans and counters show."""

    #: Its response (or its one message) is over.
    COMPLETE = "complete"
    #: The connection closed before the response finished.
    CONNECTION_CLOSED = "connection_closed"
    #: A later response, or the stream's end, showed it would never be answered.
    RESPONSE_MISSING = "response_missing"
    #: Too many exchanges were outstanding on the connection: the oldest was given up.
    EVICTED = "evicted"
    #: The connection table was full: the least recently active connection was dropped.
    CONNECTION_EVICTED = "connection_evicted"
    #: The process exited with the exchange open.
    PROCESS_EXITED = "process_exited"
    #: The peer or the protocol cancelled it (HTTP/2 RST_STREAM, GOAWAY, ...).
    CANCELLED = "cancelled"
    #: The agent stopped with the exchange open.
    AGENT_STOPPED = "agent_stopped"


class Transport(enum.IntFlag):
    """What a protocol can be carried on (a detector declares it)."""

    STREAM = 1  # TCP, Unix stream sockets, TLS plaintext
    DATAGRAM = 2  # UDP: one message per datagram


class Exchange(Protocol):
    """What the pipeline needs of any protocol's exchange.

    Protocol modules define their own exchange classes (``HttpExchange``, ...)
    with these attributes; the span semantics of the protocol reads the rest.
    """

    #: The protocol id: the package name under ``protocols/`` (``"http1"``).
    protocol: str
    #: The span kind it implies (set by the session, which knows the direction).
    kind: ExchangeKind
    #: How it ended; COMPLETE until the session (or the pipeline) says otherwise.
    outcome: Outcome
    #: When it was given up (0 when it completed normally): ``end_ns`` includes it.
    abandoned_ns: int
    #: Distinguishes concurrent exchanges of one connection or one writer
    #: (HTTP/2 stream id; RTPS writer GUID + sequence number), or None (FIFO).
    correlation_key: Hashable | None
    #: Names the message agent-wide when one sent message is read by several processes
    #: (RTPS: writer GUID + sequence number), so the readers' spans join the sender's;
    #: None (every request/response protocol) links by connection pair instead. Exchange
    #: classes set it, as a class attribute where it is always None.
    message_key: Hashable | None

    @property
    def start_ns(self) -> int: ...

    @property
    def end_ns(self) -> int: ...

    def carrier(self) -> Iterable[tuple[str, str]]:
        """Header-like (lower-case name, value) pairs that may carry trace context."""
        ...


# The session events below are built per exchange. Written as a dataclass over an
# explicit ``__init__`` and ``__slots__``, they stay slotted dataclasses as plain
# Python and become extension types with a C ``__init__`` when Cython compiles this
# module (base.pxd declares their fields).


@dataclass
class ExchangeStarted:
    """A request's head has been parsed: assign span IDs now.

    Emitted once per exchange, before its end, so that work done while the
    request is being served can name it as parent.
    """

    __slots__ = ("exchange",)
    exchange: Exchange

    def __init__(self, exchange) -> None:
        self.exchange = exchange


class Phase(enum.IntEnum):
    """What an :class:`ExchangeProgress` reports."""

    REQUEST_BODY = 1  # request body bytes (``data``)
    RESPONSE_START = 2  # the response's first byte (its head) arrived
    RESPONSE_BODY = 3  # response body bytes (``data``), e.g. one SSE chunk


@dataclass
class ExchangeProgress:
    """Something happened inside an open exchange, at ``ts_ns``.

    Body bytes arrive here as they cross the socket (h11's ``Data``), so a
    consumer can see every chunk of a streamed response with its time; what
    is kept of them is the consumer's decision.
    """

    __slots__ = ("exchange", "phase", "ts_ns", "data")
    exchange: Exchange
    phase: Phase
    ts_ns: int
    data: bytes

    def __init__(self, exchange, phase, ts_ns, data=b"") -> None:
        self.exchange = exchange
        self.phase = phase
        self.ts_ns = ts_ns
        self.data = data


@dataclass
class ExchangeCompleted:
    """The exchange is over: its response finished (``exchange.outcome`` COMPLETE),
    or the session ended it abnormally (outcome says why)."""

    __slots__ = ("exchange",)
    exchange: Exchange

    def __init__(self, exchange) -> None:
        self.exchange = exchange


@dataclass
class ExchangeAbandoned:
    """The session gave up on the exchange (``exchange.outcome`` says why,
    ``exchange.abandoned_ns`` when). Ends it like :class:`ExchangeCompleted`."""

    __slots__ = ("exchange",)
    exchange: Exchange

    def __init__(self, exchange) -> None:
        self.exchange = exchange


SessionEvent = ExchangeStarted | ExchangeProgress | ExchangeCompleted | ExchangeAbandoned


def abandon(exchange: Exchange, outcome: Outcome, ts_ns: int) -> ExchangeAbandoned:
    """Mark ``exchange`` as given up at ``ts_ns`` and make the event that ends it."""
    exchange.outcome = outcome
    exchange.abandoned_ns = ts_ns
    return ExchangeAbandoned(exchange)


class Session(Protocol):
    """One connection's (or one datagram flow's) protocol state, as seen from one traced process."""

    protocol: str
    #: Count of malformed inputs skipped (never raised).
    parse_errors: int

    def feed(self, direction: Direction, data: bytes, ts_ns: int, missing: int = 0) -> list[SessionEvent]:
        """Feed bytes that moved in ``direction`` at ``ts_ns``.

        ``missing`` counts bytes that followed ``data`` in the stream but
        were not captured (payload truncated to the capture size, or sent by
        sendfile); the parser accounts for them without seeing them. On a
        datagram transport each call is one whole datagram.
        Must never raise on any input.
        """
        ...

    def close(self, ts_ns: int) -> list[SessionEvent]:
        """The connection ended: finish what can be finished, end the rest."""
        ...


@runtime_checkable
class Detector(Protocol):
    """Recognises a protocol by content, never by port.

    A protocol's detector subclasses this class: the optional capabilities below have
    their defaults here, so the agent reads them directly instead of probing each
    detector for them (``Registry.register`` refuses a detector that does not subclass it).
    """

    #: The protocol id (the package name under ``protocols/``).
    protocol: str
    #: Where the protocol can appear (Pixie's and DeepFlow's "parsable on UDP").
    transports: Transport

    #: Whether its sessions emit ``ExchangeProgress``. Progress costs events per exchange,
    #: so sessions leave it off until a consumer asks (``Pipeline.observe_progress`` turns
    #: it on); a detector that can never report progress keeps False.
    report_progress: bool = False
    #: Asked once per exchange, when it starts, whether anyone wants that exchange's
    #: progress, so a consumer interested in a few exchanges (LLM calls among ordinary
    #: HTTP) makes the others cost nothing per body chunk. None: every exchange reports.
    progress_filter: "ProgressFilter | None" = None
    #: Its sessions account per process (RTPS's watch of DDS data on shared memory): the
    #: connection table sets each new session's ``pid`` to its connection's process.
    per_process_sessions: bool = False

    def detect(self, direction: Direction, data: bytes) -> Direction | None:
        """Return the direction that carries requests if ``data`` (the first
        bytes seen moving in ``direction``) opens this protocol, else None."""
        ...

    def new_session(self, request_direction: Direction) -> Session: ...

    def take_notices(self) -> list[str]:
        """Lines for the agent's log, each said once (the agent asks once a second)."""
        return []

    def take_counts(self) -> list[tuple[str, int, str]]:
        """Self-metric increments counted since the last call, as (name, amount, label)
        (the compiled fast path's share of the traffic); asked after every batch."""
        return []


ProgressFilter = Callable[["Exchange"], bool]
