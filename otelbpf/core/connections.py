"""The bounded connection table: one entry per connection a traced process uses.

A stream connection is keyed by the kernel's ``conn_id`` (unique per sighting
of a (pid, fd) socket, so fd reuse starts a fresh entry) *and* the source
that saw its bytes (socket syscalls, or the TLS library's plaintext): the
same socket carries ciphertext and plaintext, and each is detected, parsed
and muted on its own. A datagram socket (UDP) talks to many peers, so each
(socket, source, peer) is its own entry, a *flow*, fed one datagram at a
time. An entry holds the tuple, the process, and, once the first bytes have
chosen one, the protocol session that turns its byte streams into exchanges.
Detection is by content: the first bytes in either direction are offered to
every detector registered for the transport (stream or datagram).

The table is an LRU bounded by ``max_connections``; the least recently
active connection is evicted (its open exchanges ended and counted) when a
new one would exceed the bound, so a flood of connections cannot exhaust
memory. Connections whose protocol no detector recognised stay as cheap
tombstones (so their later bytes are skipped at once) until closed.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Iterable

from otelbpf.core.events import ConnOpen, ContextOrigin, DataEvent, DataFlags, DatagramEvent, RoleHint, Source
from otelbpf.core.selfmetrics import Counters
from protocols.base import Detector, Direction, Outcome, Session, SessionEvent, Transport

_SENDFILE = int(DataFlags.SENDFILE)
_CLIENT_CONTEXT = int(ContextOrigin.CLIENT)
#: Stream entries are keyed by ``conn_id * _SOURCES + source`` (an int: cheap to hash).
_SOURCES = 4

#: How many data events (and bytes per direction) to look at before deciding
#: a connection carries no protocol we know.
DETECT_MAX_EVENTS = 4
DETECT_MAX_BYTES = 512


class Connection:
    __slots__ = (
        "conn_id",
        "pid",
        "fd",
        "family",
        "local_addr",
        "local_port",
        "peer_addr",
        "peer_port",
        "role_hint",
        "comm",
        "sock_id",
        "peer_sock_id",
        "opened_ns",
        "session",
        "unrecognized",
        "sendfile_ns",
        "source",
        "datagram",
        "key",
        "exchanges",
        "end_outcome",
        "shed",
        "wants_bodies",
        "missing_bytes",
        "wire_ctx",
        "wire_ctx_ns",
        "wire_ctx_dir",
        "_probe_events",
        "_parse_errors_seen",
    )

    def __init__(self, conn_id: int, pid: int, fd: int, opened_ns: int) -> None:
        self.conn_id = conn_id
        self.pid = pid
        self.fd = fd
        self.family = 0
        self.local_addr = ""
        self.local_port = 0
        self.peer_addr = ""
        self.peer_port = 0
        self.role_hint = RoleHint.UNKNOWN
        self.comm = ""
        self.sock_id = 0
        self.peer_sock_id = 0
        self.opened_ns = opened_ns
        self.session: Session | None = None
        self.unrecognized = False
        #: Timestamp of the last sendfile() on this connection (0 = never):
        #: lets spans say their body moved without passing through userspace.
        self.sendfile_ns = 0
        #: Which probe family feeds it (events.Source), and whether it is a datagram flow.
        self.source = Source.SOCKET
        self.datagram = False
        #: Its key in the table.
        self.key: int | tuple = conn_id * _SOURCES
        #: Exchanges started and not yet ended, by id(): the pipeline's record,
        #: so that it can end any a session leaves open (docs/architecture.md).
        self.exchanges: dict[int, object] = {}
        #: Why the connection is ending (set just before its session closes).
        self.end_outcome = Outcome.CONNECTION_CLOSED
        #: Muted to keep the agent within its CPU budget (see ConnectionTable.shed_permille).
        self.shed = False
        #: An exchange on it reported progress (its bodies are read): marked for whole capture.
        self.wants_bodies = False
        #: Bytes its calls moved that the capture cut off (past the prefix or the whole-capture bound).
        self.missing_bytes = 0
        #: The kernel's ids for the request whose read or write is the latest data event that had
        #: them (DataEvent.trace_ctx), until an exchange starting at or after that event takes them
        #: (the pipeline); its time and direction. Dropped by a data event the other way.
        self.wire_ctx = None
        self.wire_ctx_ns = 0
        self.wire_ctx_dir = Direction.INGRESS
        self._probe_events: list[DataEvent | DatagramEvent] = []
        self._parse_errors_seen = 0

    def take_identity(self, other: ConnOpen | "Connection") -> None:
        """The socket's tuple, role, process name and socket identities, from
        its open record or from another entry of the same socket."""
        for name in _IDENTITY:
            setattr(self, name, getattr(other, name))

    @classmethod
    def from_open(cls, event: ConnOpen) -> "Connection":
        conn = cls(event.conn_id, event.pid, event.fd, event.ts_ns)
        conn.take_identity(event)
        return conn

    def derived(self, key: int | tuple, source: int, opened_ns: int) -> "Connection":
        """Another entry of the same socket (another source, or a datagram flow): same tuple and process."""
        conn = Connection(self.conn_id, self.pid, self.fd, opened_ns)
        conn.take_identity(self)
        conn.source = source
        conn.key = key
        return conn

    @property
    def protocol(self) -> str:
        return self.session.protocol if self.session is not None else ""


#: What entries of one socket share (ConnOpen and Connection both have these).
_IDENTITY = (
    "family", "local_addr", "local_port", "peer_addr", "peer_port", "role_hint", "comm", "sock_id", "peer_sock_id",
)  # fmt: skip

ExchangeHandler = Callable[[Connection, DataEvent | DatagramEvent | None, list[SessionEvent]], None]


class ConnectionTable:
    """Routes data events to per-connection (and per-flow) protocol sessions.

    ``on_events(conn, event, session_events)`` gets what a session reported
    (``event`` is None when the connection ended); ``on_ended(conn, ts_ns)``
    is told once a connection's session has closed, so the pipeline can end
    whatever the session left open.
    """

    def __init__(
        self,
        detectors: Iterable[Detector],
        on_events: ExchangeHandler,
        counters: Counters,
        max_connections: int = 16384,
        on_unrecognized: Callable[[Connection], None] | None = None,
        on_ended: Callable[[Connection, int], None] | None = None,
    ) -> None:
        detectors = list(detectors)
        self.stream_detectors = [d for d in detectors if d.transports & Transport.STREAM]
        self.datagram_detectors = [d for d in detectors if d.transports & Transport.DATAGRAM]
        self.on_events = on_events
        self.on_ended = on_ended
        self.counters = counters
        self.max_connections = max_connections
        #: Told when a live connection is given up on (the eBPF source then
        #: stops copying its payloads in the kernel, for that source only).
        self.on_unrecognized = on_unrecognized
        #: Share of connections (per mille, chosen by a hash of conn_id) muted to
        #: keep the agent within its CPU budget: new ones at once, open ones
        #: as soon as no exchange is open on them (never mid-exchange).
        self.shed_permille = 0
        self._conns: OrderedDict[int | tuple, Connection] = OrderedDict()
        #: Marks a key most recently used (bound once: a method look-up per event otherwise).
        self._touch = self._conns.move_to_end
        #: conn_id -> keys of its entries (sources, datagram flows), to close them all.
        self._by_conn_id: dict[int, set[int | tuple]] = {}
        self._by_pid: dict[int, set[int]] = {}

    def __len__(self) -> int:
        return len(self._conns)

    def get(self, conn_id: int, source: int = Source.SOCKET) -> Connection | None:
        return self._conns.get(conn_id * _SOURCES + source)

    def connections(self) -> list[Connection]:
        return list(self._conns.values())

    # -- lifecycle -------------------------------------------------------

    def open(self, event: ConnOpen) -> Connection:
        key = event.conn_id * _SOURCES
        old = self._conns.get(key)
        if old is not None:
            self._remove(old)
            self._end_session(old, event.ts_ns)
        conn = Connection.from_open(event)
        self._insert(conn)
        return conn

    def _insert(self, conn: Connection) -> None:
        """Add ``conn``, evicting the least recently active ones beyond the bound."""
        while len(self._conns) >= self.max_connections:
            _, victim = self._conns.popitem(last=False)
            self._forget_links(victim)
            self.counters.add("otelbpf.connections.evicted")
            victim.end_outcome = Outcome.CONNECTION_EVICTED
            self._end_session(victim, conn.opened_ns)
        self._conns[conn.key] = conn
        self._by_conn_id.setdefault(conn.conn_id, set()).add(conn.key)
        self._by_pid.setdefault(conn.pid, set()).add(conn.conn_id)
        self.counters.add("otelbpf.connections.opened")
        if self.shed_permille and self.sheddable(conn):
            self.shed(conn)

    def sheddable(self, conn: Connection) -> bool:
        """Is ``conn`` among the connections shed at the current rate? (Stable per connection.)"""
        return (conn.conn_id * 2654435761) % 1000 < self.shed_permille and not conn.shed

    def shed(self, conn: Connection) -> None:
        """Stop tracing ``conn`` to save CPU; the caller makes sure no exchange is open on it."""
        conn.shed = True
        conn.unrecognized = True  # later bytes are skipped at once
        conn._probe_events = []
        if conn.session is not None:
            conn.session.close(0)  # nothing is open: nothing to report
            conn.session = None
        self.counters.add("otelbpf.budget.connections.shed")
        if self.on_unrecognized is not None and not conn.datagram:
            self.on_unrecognized(conn)  # mutes it in the kernel, for its source only

    def peer(self, conn_id: int, peer_sock_id: int) -> None:
        for key in self._by_conn_id.get(conn_id, ()):
            self._conns[key].peer_sock_id = peer_sock_id

    def close(self, conn_id: int, ts_ns: int, outcome: Outcome = Outcome.CONNECTION_CLOSED) -> None:
        """The socket closed: end every entry it has (each source, each datagram flow)."""
        keys = self._by_conn_id.pop(conn_id, None)
        if not keys:
            return
        for key in keys:
            conn = self._conns.pop(key)
            conn.end_outcome = outcome
            self._end_session(conn, ts_ns)
        ids = self._by_pid.get(conn.pid)
        if ids is not None:
            ids.discard(conn_id)
            if not ids:
                del self._by_pid[conn.pid]

    def close_process(self, pid: int, ts_ns: int) -> None:
        for conn_id in list(self._by_pid.get(pid, ())):
            self.close(conn_id, ts_ns, Outcome.PROCESS_EXITED)
        self._by_pid.pop(pid, None)

    def close_all(self, ts_ns: int) -> None:
        for conn_id in list(self._by_conn_id):
            self.close(conn_id, ts_ns, Outcome.AGENT_STOPPED)

    def _remove(self, conn: Connection) -> None:
        self._conns.pop(conn.key, None)
        self._forget_links(conn)

    def _forget_links(self, conn: Connection) -> None:
        keys = self._by_conn_id.get(conn.conn_id)
        if keys is None:
            return
        keys.discard(conn.key)
        if keys:
            return
        del self._by_conn_id[conn.conn_id]
        ids = self._by_pid.get(conn.pid)
        if ids is not None:
            ids.discard(conn.conn_id)
            if not ids:
                del self._by_pid[conn.pid]

    def _end_session(self, conn: Connection, ts_ns: int) -> None:
        if conn.session is None:
            if conn._probe_events and not conn.unrecognized:
                # closed before detection gave up: it carried nothing we know
                conn._probe_events = []
                conn.unrecognized = True
                self.counters.add("otelbpf.connections.unrecognized")
            return
        events = conn.session.close(ts_ns)
        self._account_parse_errors(conn)
        if events:
            self.on_events(conn, None, events)
        if self.on_ended is not None:
            self.on_ended(conn, ts_ns)

    # -- data ------------------------------------------------------------

    def data(self, event: DataEvent) -> None:
        """Bytes moved on a stream connection."""
        conns = self._conns
        key = event.conn_id * _SOURCES + event.source
        conn = conns.get(key)
        if conn is None:
            conn = self._first_sight(event, key)
        else:
            self._touch(key)
        if event.flags & _SENDFILE:
            conn.sendfile_ns = event.ts_ns
        if conn.session is not None:
            if event.trace_ctx is not None or conn.wire_ctx is not None:
                self._note_context(conn, event)
            data = event.data  # the fields read here, where the event's type is known (typed when compiled)
            missing = event.total_len - len(data)
            if missing > 0:
                conn.missing_bytes += missing
            self._feed(conn, event, event.direction, data, event.ts_ns, missing)
        elif not conn.unrecognized:
            self._detect(conn, event, self.stream_detectors)

    def _note_context(self, conn: Connection, event: DataEvent) -> None:
        """Keep the ids the kernel fixed for a request (cross-node propagation) for the
        exchange that starts at this event or after it; a data event the other way (the
        answer) drops ids no exchange took. A client's unclaimed ids are counted: they
        went on the wire, and the other node's span names a parent no span here has."""
        context = event.trace_ctx
        if context is not None:
            if conn.wire_ctx is not None:
                self._unclaimed(conn)
            conn.wire_ctx = context
            conn.wire_ctx_ns = event.ts_ns
            conn.wire_ctx_dir = event.direction
        elif event.direction != conn.wire_ctx_dir:
            self._unclaimed(conn)
            conn.wire_ctx = None

    def _unclaimed(self, conn: Connection) -> None:
        if conn.wire_ctx.origin == _CLIENT_CONTEXT:
            self.counters.add("otelbpf.propagation.unclaimed")

    def _feed(
        self, conn: Connection, event: DataEvent | DatagramEvent, direction: Direction, data: bytes, ts_ns: int, missing: int
    ) -> None:
        """Hand the bytes ``event`` moved to the connection's session; route what it reports."""
        session = conn.session
        out = session.feed(direction, data, ts_ns, missing)
        if out:
            self.on_events(conn, event, out)
        if session.parse_errors != conn._parse_errors_seen:
            self._account_parse_errors(conn)

    def _first_sight(self, event: DataEvent, key: int) -> Connection:
        """Data with no entry yet: the open record was lost, the source sends
        none, or this is a second source of a known socket (TLS plaintext)."""
        socket_conn = self._conns.get(event.conn_id * _SOURCES) if event.source else None
        if socket_conn is not None:
            conn = socket_conn.derived(key, event.source, event.ts_ns)
            if event.source == Source.TLS:
                self._mute_ciphertext(socket_conn, event.ts_ns)
        else:
            conn = Connection(event.conn_id, event.pid, event.fd, event.ts_ns)
            conn.source = event.source
            conn.key = key
        if event.source == Source.TLS:
            self.counters.add("otelbpf.tls.connections")
        self._insert(conn)
        return conn

    def _mute_ciphertext(self, conn: Connection, ts_ns: int) -> None:
        """The socket carries TLS: its own bytes are ciphertext. Never parse
        them (whatever a detector made of them), and stop their copying in the
        kernel; the plaintext entry of the same socket is not affected."""
        if conn.unrecognized and conn.session is None:
            return  # already given up on (and muted)
        if conn.session is not None:
            self._end_session(conn, ts_ns)
            conn.session = None
        conn._probe_events = []
        conn.unrecognized = True
        if self.on_unrecognized is not None:
            self.on_unrecognized(conn)  # mutes its SOCKET source only

    def datagram(self, event: DatagramEvent) -> None:
        """One datagram sent or received: fed to its (socket, source, peer) flow's session."""
        key = (event.conn_id, event.source, event.peer_addr, event.peer_port)
        conn = self._conns.get(key)
        if conn is None:
            conn = self._new_flow(event, key)
        else:
            self._touch(key)
        if conn.session is not None:
            data = event.data
            self._feed(conn, event, event.direction, data, event.ts_ns, event.total_len - len(data))
        elif not conn.unrecognized:
            self._detect(conn, event, self.datagram_detectors)

    def _new_flow(self, event: DatagramEvent, key: tuple) -> Connection:
        socket_conn = self._conns.get(event.conn_id * _SOURCES)
        if socket_conn is not None:
            conn = socket_conn.derived(key, event.source, event.ts_ns)
        else:
            conn = Connection(event.conn_id, event.pid, event.fd, event.ts_ns)
            conn.source = event.source
            conn.key = key
            conn.family = event.family
        conn.datagram = True
        if event.peer_addr or event.peer_port:
            conn.peer_addr = event.peer_addr
            conn.peer_port = event.peer_port
        if event.family:
            conn.family = event.family
        self._insert(conn)
        return conn

    def _detect(self, conn: Connection, event: DataEvent | DatagramEvent, detectors: list[Detector]) -> None:
        conn._probe_events.append(event)
        for direction in (Direction.INGRESS, Direction.EGRESS):
            if conn.datagram:  # each datagram is a message of its own: look at the first one
                prefix = next((e.data for e in conn._probe_events if e.direction == direction), b"")
            else:
                prefix = b"".join(e.data for e in conn._probe_events if e.direction == direction)
            prefix = prefix[:DETECT_MAX_BYTES]
            if not prefix:
                continue
            for detector in detectors:
                request_direction = detector.detect(direction, prefix)
                if request_direction is not None:
                    self._start_session(conn, detector, request_direction)
                    return
        if len(conn._probe_events) >= DETECT_MAX_EVENTS:
            conn._probe_events = []
            conn.unrecognized = True
            self.counters.add("otelbpf.connections.unrecognized")
            # A datagram socket talks to many peers: one flow's silence must not mute the others.
            if self.on_unrecognized is not None and not conn.datagram:
                self.on_unrecognized(conn)

    def _start_session(self, conn: Connection, detector: Detector, request_direction: Direction) -> None:
        conn.session = detector.new_session(request_direction)
        if detector.per_process_sessions:  # protocols/rtps: DataWatch
            conn.session.pid = conn.pid
        buffered, conn._probe_events = conn._probe_events, []
        for event in buffered:
            if not conn.datagram and (event.trace_ctx is not None or conn.wire_ctx is not None):
                self._note_context(conn, event)
            out = conn.session.feed(event.direction, event.data, event.ts_ns, event.total_len - len(event.data))
            if out:
                self.on_events(conn, event, out)
        self._account_parse_errors(conn)

    def _account_parse_errors(self, conn: Connection) -> None:
        errors = conn.session.parse_errors if conn.session is not None else 0
        if errors > conn._parse_errors_seen:
            self.counters.add("otelbpf.parse.errors", errors - conn._parse_errors_seen, label=conn.protocol)
            conn._parse_errors_seen = errors
