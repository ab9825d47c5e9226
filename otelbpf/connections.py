"""The bounded connection table: one entry per connection a traced process uses.

A connection is keyed by the kernel's ``conn_id`` (unique per sighting of a
(pid, fd) socket, so fd reuse starts a fresh entry). It holds the tuple, the
process, and, once the first bytes have chosen one, the protocol session that
turns its two byte streams into exchanges. Detection is by content: the first
bytes in either direction are offered to every detector.

The table is an LRU bounded by ``max_connections``; the least recently
active connection is evicted (its open exchanges ended and counted) when a
new one would exceed the bound, so a flood of connections cannot exhaust
memory. Connections whose protocol no detector recognised stay as cheap
tombstones (so their later bytes are skipped at once) until closed.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Iterable

from otelbpf.events import ConnOpen, DataEvent, DataFlags, RoleHint
from otelbpf.selfmetrics import Counters
from protocols.base import Detector, Direction, Session, SessionEvent

_SENDFILE = int(DataFlags.SENDFILE)

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
        self._probe_events: list[DataEvent] = []
        self._parse_errors_seen = 0

    @classmethod
    def from_open(cls, event: ConnOpen) -> "Connection":
        conn = cls(event.conn_id, event.pid, event.fd, event.ts_ns)
        conn.family = event.family
        conn.local_addr = event.local_addr
        conn.local_port = event.local_port
        conn.peer_addr = event.peer_addr
        conn.peer_port = event.peer_port
        conn.role_hint = event.role_hint
        conn.comm = event.comm
        conn.sock_id = event.sock_id
        conn.peer_sock_id = event.peer_sock_id
        return conn

    @property
    def protocol(self) -> str:
        return self.session.protocol if self.session is not None else ""


ExchangeHandler = Callable[[Connection, DataEvent | None, list[SessionEvent]], None]


class ConnectionTable:
    """Routes data events to per-connection protocol sessions."""

    def __init__(
        self,
        detectors: Iterable[Detector],
        on_events: ExchangeHandler,
        counters: Counters,
        max_connections: int = 16384,
        on_unrecognized: Callable[[Connection], None] | None = None,
    ) -> None:
        self.detectors = list(detectors)
        self.on_events = on_events
        self.counters = counters
        self.max_connections = max_connections
        #: Told when a live connection is given up on (the eBPF source then
        #: stops copying its payloads in the kernel).
        self.on_unrecognized = on_unrecognized
        self._conns: OrderedDict[int, Connection] = OrderedDict()
        self._by_pid: dict[int, set[int]] = {}

    def __len__(self) -> int:
        return len(self._conns)

    def get(self, conn_id: int) -> Connection | None:
        return self._conns.get(conn_id)

    # -- lifecycle -------------------------------------------------------

    def open(self, event: ConnOpen) -> Connection:
        old = self._conns.get(event.conn_id)
        if old is not None:
            self._finish(old, event.ts_ns)
        conn = Connection.from_open(event)
        self._insert(conn)
        return conn

    def _insert(self, conn: Connection) -> None:
        """Add ``conn``, evicting the least recently active ones beyond the bound."""
        while len(self._conns) >= self.max_connections:
            _, victim = self._conns.popitem(last=False)
            self._forget_pid_link(victim)
            self.counters.add("otelbpf.connections.evicted")
            self._end_session(victim, conn.opened_ns)
        self._conns[conn.conn_id] = conn
        self._by_pid.setdefault(conn.pid, set()).add(conn.conn_id)
        self.counters.add("otelbpf.connections.opened")

    def peer(self, conn_id: int, peer_sock_id: int) -> None:
        conn = self._conns.get(conn_id)
        if conn is not None:
            conn.peer_sock_id = peer_sock_id

    def close(self, conn_id: int, ts_ns: int) -> None:
        conn = self._conns.pop(conn_id, None)
        if conn is not None:
            self._forget_pid_link(conn)
            self._end_session(conn, ts_ns)

    def close_process(self, pid: int, ts_ns: int) -> None:
        for conn_id in list(self._by_pid.get(pid, ())):
            self.close(conn_id, ts_ns)
        self._by_pid.pop(pid, None)

    def close_all(self, ts_ns: int) -> None:
        for conn_id in list(self._conns):
            self.close(conn_id, ts_ns)

    def _finish(self, conn: Connection, ts_ns: int) -> None:
        self._conns.pop(conn.conn_id, None)
        self._forget_pid_link(conn)
        self._end_session(conn, ts_ns)

    def _forget_pid_link(self, conn: Connection) -> None:
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

    # -- data ------------------------------------------------------------

    def data(self, event: DataEvent) -> None:
        conns = self._conns
        conn = conns.get(event.conn_id)
        if conn is None:
            # Data without a ConnOpen: the open record was lost, or the
            # source does not send them. Start from what we know.
            conn = Connection(event.conn_id, event.pid, event.fd, event.ts_ns)
            self._insert(conn)
        else:
            conns.move_to_end(event.conn_id)
        if event.flags & _SENDFILE:
            conn.sendfile_ns = event.ts_ns
        if conn.session is not None:
            out = conn.session.feed(event.direction, event.data, event.ts_ns, event.total_len - len(event.data))
            if out:
                self.on_events(conn, event, out)
            if conn.session.parse_errors != conn._parse_errors_seen:
                self._account_parse_errors(conn)
            return
        if conn.unrecognized:
            return
        self._detect(conn, event)

    def _detect(self, conn: Connection, event: DataEvent) -> None:
        conn._probe_events.append(event)
        for direction in (Direction.INGRESS, Direction.EGRESS):
            prefix = b"".join(e.data for e in conn._probe_events if e.direction == direction)[:DETECT_MAX_BYTES]
            if not prefix:
                continue
            for detector in self.detectors:
                request_direction = detector.detect(direction, prefix)
                if request_direction is not None:
                    self._start_session(conn, detector, request_direction)
                    return
        if len(conn._probe_events) >= DETECT_MAX_EVENTS:
            conn._probe_events = []
            conn.unrecognized = True
            self.counters.add("otelbpf.connections.unrecognized")
            if self.on_unrecognized is not None:
                self.on_unrecognized(conn)

    def _start_session(self, conn: Connection, detector: Detector, request_direction: Direction) -> None:
        conn.session = detector.new_session(request_direction)
        buffered, conn._probe_events = conn._probe_events, []
        for event in buffered:
            out = conn.session.feed(event.direction, event.data, event.ts_ns, event.total_len - len(event.data))
            if out:
                self.on_events(conn, event, out)
        self._account_parse_errors(conn)

    def _account_parse_errors(self, conn: Connection) -> None:
        errors = conn.session.parse_errors if conn.session is not None else 0
        if errors > conn._parse_errors_seen:
            self.counters.add("otelbpf.parse.errors", errors - conn._parse_errors_seen, label=conn.protocol)
            conn._parse_errors_seen = errors
