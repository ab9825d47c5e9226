"""Replay a packet capture as if each endpoint in it were a traced process.

A capture (pcap or pcapng, as tcpdump or Wireshark write them) holds what went
over the wire; the agent's pipeline wants what processes read and wrote. This
source bridges the two so the same pipeline can be run, debugged and tested
on recorded traffic without eBPF:

* each server endpoint (ip, port) and each client ip becomes a synthetic
  process with a small pid (``otelbpf.sources.pcap.processes``);
* each TCP connection becomes, per traced side, a :class:`ConnOpen`, the
  byte stream that side read (INGRESS) and wrote (EGRESS) as
  :class:`DataEvent` s, and a :class:`ConnClose`; the byte streams are
  rebuilt by ``otelbpf.sources.pcap.streams``;
* each UDP endpoint is a socket of such a process, and each datagram a
  :class:`DatagramEvent` for its sender and its receiver
  (``otelbpf.sources.pcap.datagrams`` says how, and which side is the
  server).

Which side of a TCP connection is the server: the one that received the SYN
(or sent the SYN-ACK). For a connection already open when the capture began,
it is a guess, in this order: the endpoint more earlier connections in the
capture already used (clients take a fresh port per connection, servers keep
theirs); then the lower port (servers listen on well-known or registered
ports, below the ephemeral range clients draw from); then the destination of
the first packet seen. Such connections get ``RoleHint.UNKNOWN``, as the
eBPF source gives to connections that predate the agent, and only start at a
packet that carries data: a stray ACK, FIN or RST of a connection never seen
opening says nothing worth tracing.

Files are read by ``otelbpf.sources.pcap.files``, frames decoded by
``otelbpf.sources.pcap.link``.
"""

from __future__ import annotations

import socket
from collections import deque
from dataclasses import dataclass, field
from os import PathLike
from typing import Iterator, Literal

from otelbpf.core.events import ConnClose, ConnOpen, DataEvent, Event, RoleHint
from otelbpf.sources.pcap.datagrams import UdpSockets
from otelbpf.sources.pcap.files import open_capture
from otelbpf.sources.pcap.fragments import Ipv4Fragments
from otelbpf.sources.pcap.link import TH_ACK, TH_FIN, TH_RST, TH_SYN, Datagram, Segment, decode_packet
from otelbpf.sources.pcap.processes import Endpoint, SyntheticProcesses, format_ip
from otelbpf.sources.pcap.streams import Piece, Stream
from protocols.base import Direction

Perspective = Literal["server", "client", "both"]


def new_stats() -> dict[str, int]:
    """The counters a replay keeps, all zero (see :attr:`PcapSource.stats`)."""
    return dict.fromkeys(
        (
            "packets",  # records read from the file
            "tcp_segments",  # of which TCP over IPv4/IPv6 (and reassembled from fragments)
            "udp_datagrams",  # of which UDP over IPv4/IPv6 (and reassembled from fragments)
            "unsupported",  # not IP, neither TCP nor UDP, or an unknown link type
            "malformed",  # IP, TCP or UDP header that does not decode
            "ip_fragments",  # IP fragments of TCP or UDP, put aside for reassembly
            "fragments_reassembled",  # IPv4 datagrams rebuilt from them (and counted again above)
            "fragments_dropped",  # fragments of datagrams never completed (and all IPv6 ones)
            "truncated_packets",  # captured fewer payload bytes than IP says (snap length)
            "incomplete_records",  # 1 if the file ends inside a record (cut short)
            "connections",  # TCP connections replayed
            "udp_sockets",  # UDP sockets replayed (per traced process and endpoint)
            "multicast_datagrams",  # UDP datagrams to a group address (replayed sender-side only)
            "retransmits",  # segments that repeated bytes already seen
            "out_of_order",  # segments that arrived ahead of a hole
            "holes",  # gaps given up on and reported as missing
            "missing_bytes",  # bytes reported as missing: holes and snap length cuts
        ),
        0,
    )


# --- connections and synthetic processes ----------------------------------------

#: How long stray packets of a closed connection (the last ACK, a repeated
#: FIN) are recognised and ignored rather than taken for a new connection:
#: twice TCP's usual TIME_WAIT. Older closed connections are forgotten, so a
#: long capture holds only the recent ones in memory.
CLOSED_CONNECTION_MEMORY_NS = 120 * 1_000_000_000

_FlowKey = tuple[bytes, int, bytes, int]  # (src ip, src port, dst ip, dst port)
#: Who reads or writes a direction's bytes: (pid, fd, conn_id, direction), the
#: sender's side first (it wrote them before the receiver could read them).
_Fanout = tuple[tuple[int, int, int, Direction], ...]


@dataclass(slots=True, eq=False)
class _Flow:
    """One TCP connection and the traced sides replaying it."""

    #: The client's SYN sequence number, to tell a repeated SYN from a new
    #: connection on the same addresses; None if the SYN was not seen.
    client_isn: int | None
    #: The flow's two keys: as sent by its client, and by its server.
    keys: tuple[_FlowKey, _FlowKey]
    #: (bytes from the server, bytes from the client), indexed by from_client.
    fanout: tuple[_Fanout, _Fanout]
    #: (pid, fd, conn_id) of each traced side, client first.
    sides: list[tuple[int, int, int]]
    to_server: Stream
    to_client: Stream
    closed_at: int | None = None


@dataclass(slots=True)
class _Chunk:
    """Stream bytes being gathered into one DataEvent (``capture_bytes`` mode)."""

    flow: _Flow
    from_client: bool
    ts: int
    parts: list[bytes] = field(default_factory=list)
    size: int = 0
    missing: int = 0


class PcapSource:
    """Events from a capture file, as the traced endpoints would have seen them.

    ``perspective``: trace the servers, the clients, or both sides of every
    connection. ``capture_bytes``: if set, consecutive stream bytes moving
    the same way are gathered into DataEvents of up to that many captured
    bytes, like reads and writes of that size (nothing is dropped); if None,
    each TCP segment is one event. Each UDP datagram is one DatagramEvent
    whatever ``capture_bytes``. The file is opened and checked here, so a
    bad file fails at once with a :class:`PcapError`; :meth:`events` reads it
    (again) from the start.
    """

    def __init__(
        self,
        path: str | PathLike[str],
        perspective: Perspective = "server",
        capture_bytes: int | None = None,
    ) -> None:
        if perspective not in ("server", "client", "both"):
            raise ValueError(f"perspective must be 'server', 'client' or 'both', not {perspective!r}")
        if capture_bytes is not None and capture_bytes < 1:
            raise ValueError(f"capture_bytes must be positive or None, not {capture_bytes}")
        self.path = path
        self.perspective: Perspective = perspective
        self.capture_bytes = capture_bytes
        #: Counters of the last (or running) replay, for the agent to log.
        self.stats = new_stats()
        #: pid -> the synthetic process it stands for. An entry appears before
        #: the first event that carries its pid.
        self.endpoints: dict[int, Endpoint] = {}
        open_capture(path, new_stats()).close()

    def events(self) -> Iterator[Event]:
        """Replay the file: ConnOpen, DataEvents, ConnClose per connection and
        traced side; ConnOpen, DatagramEvents, ConnClose per UDP socket of a
        traced side (its ConnClose at the end of the file); in capture order
        (which is timestamp order for files tcpdump writes). Resets
        :attr:`stats` and :attr:`endpoints`."""
        self.stats = new_stats()
        self.endpoints = {}
        return _Replay(self).run()


class _Replay:
    """The state of one pass over the file."""

    def __init__(self, source: PcapSource) -> None:
        self.path = source.path
        self.stats = source.stats
        self.processes = SyntheticProcesses(source.endpoints)
        self.trace_servers = source.perspective in ("server", "both")
        self.trace_clients = source.perspective in ("client", "both")
        self.capture_bytes = source.capture_bytes
        #: Both keys of every open or recently closed flow -> (flow, key is the client's).
        self.flows: dict[_FlowKey, tuple[_Flow, bool]] = {}
        self.open_flows: dict[_Flow, None] = {}  # insertion-ordered set
        self.recently_closed: deque[tuple[int, _Flow]] = deque()  # (closed at, flow), oldest first
        self.servers: set[tuple[bytes, int]] = set()
        self.endpoint_uses: dict[tuple[bytes, int], int] = {}
        self.chunk: _Chunk | None = None
        self.out: list[Event] = []
        self.udp = UdpSockets(self.processes, self.out, self.stats, self.trace_servers, self.trace_clients)
        self.fragments = Ipv4Fragments(self.stats)

    def run(self) -> Iterator[Event]:
        stats, out, fragments, udp = self.stats, self.out, self.fragments, self.udp
        last_ts = 0
        reader = open_capture(self.path, stats)
        try:
            for ts, link_type, frame in reader.frames():
                stats["packets"] += 1
                last_ts = ts
                packet = decode_packet(link_type, frame, ts, stats, fragments)
                if packet is None:
                    continue
                if packet.__class__ is Datagram:
                    self.flush_chunk()  # stream bytes gathered so far go first, in time order
                    udp.on_datagram(ts, packet)
                else:
                    self.on_segment(ts, packet)
                if out:
                    yield from out
                    out.clear()
        finally:
            reader.close()
        fragments.finish()
        for flow in list(self.open_flows):
            self.close(flow, last_ts)
        udp.close_all(last_ts)
        yield from out
        out.clear()

    def on_segment(self, ts: int, segment: Segment) -> None:
        """Feed one segment to its connection's reassembly; queue the events."""
        found = self.find_flow(ts, segment)
        if found is None:
            return
        flow, from_client = found
        _, _, _, _, seq, ack, flags, payload, missing = segment
        if flags & TH_SYN:
            (flow.to_server if from_client else flow.to_client).start(seq + 1)
            if flags & TH_ACK:
                (flow.to_client if from_client else flow.to_server).start(ack)
            seq += 1
        sending, receiving = (flow.to_server, flow.to_client) if from_client else (flow.to_client, flow.to_server)
        if flags & TH_ACK:
            acknowledged: list[Piece] = []
            receiving.acknowledge(ts, ack, acknowledged)
            if acknowledged:
                self.emit(flow, not from_client, acknowledged)
        length = len(payload) + missing
        fin = bool(flags & TH_FIN)
        if length or fin:
            pieces: list[Piece] = []
            sending.segment(ts, seq, payload, length, fin, pieces)
            if pieces:
                self.emit(flow, from_client, pieces)
        if flags & TH_RST or (flow.to_server.fin_position is not None and flow.to_client.fin_position is not None):
            self.close(flow, ts)  # at the RST or the later FIN

    def find_flow(self, ts: int, segment: Segment) -> tuple[_Flow, bool] | None:
        """The open connection ``segment`` belongs to and whether its client
        sent it; a new connection if it opens one; None to ignore it."""
        src, sport, dst, dport, seq, _, flags, _, _ = segment
        known = self.flows.get((src, sport, dst, dport))
        if known is None:
            return self.new_flow(ts, segment)
        flow = known[0]
        opening = flags & (TH_SYN | TH_ACK) == TH_SYN
        if flow.closed_at is not None:
            if not opening and ts - flow.closed_at <= CLOSED_CONNECTION_MEMORY_NS:
                return None  # a straggler of a connection just closed
            return self.new_flow(ts, segment)
        if opening and flow.client_isn != seq:
            self.close(flow, ts)  # the addresses are being reused
            return self.new_flow(ts, segment)
        return known

    def new_flow(self, ts: int, segment: Segment) -> tuple[_Flow, bool] | None:
        """Start tracking the connection ``segment`` belongs to, or None if
        the segment does not show where one starts (see the module doc)."""
        src, sport, dst, dport, seq, _, flags, payload, missing = segment
        handshake = bool(flags & TH_SYN)
        if handshake:
            sent_by_client = not flags & TH_ACK
        elif payload or missing:
            sent_by_client = self.guess_destination_is_server((src, sport), (dst, dport))
        else:
            return None
        self.forget_old_flows(ts)
        client, server = ((src, sport), (dst, dport)) if sent_by_client else ((dst, dport), (src, sport))
        for endpoint in (client, server):
            self.endpoint_uses[endpoint] = self.endpoint_uses.get(endpoint, 0) + 1
        self.servers.add(server)
        self.stats["connections"] += 1
        fanout, sides = self.open_connection(ts, client, server, handshake)
        keys = ((client[0], client[1], server[0], server[1]), (server[0], server[1], client[0], client[1]))
        client_isn = seq if handshake and sent_by_client else None
        flow = _Flow(client_isn, keys, fanout, sides, Stream(self.stats), Stream(self.stats))
        self.flows[keys[0]] = (flow, True)
        self.flows[keys[1]] = (flow, False)
        self.open_flows[flow] = None
        return flow, sent_by_client

    def guess_destination_is_server(self, source: tuple[bytes, int], destination: tuple[bytes, int]) -> bool:
        """For a connection seen first mid-way: which end is the server."""
        source_score = (source in self.servers, self.endpoint_uses.get(source, 0))
        destination_score = (destination in self.servers, self.endpoint_uses.get(destination, 0))
        if source_score != destination_score:
            return destination_score > source_score
        if source[1] != destination[1]:
            return destination[1] < source[1]
        return True

    def forget_old_flows(self, now: int) -> None:
        """Drop flows closed longer ago than CLOSED_CONNECTION_MEMORY_NS
        (unless their addresses already belong to a newer flow)."""
        closed = self.recently_closed
        while closed and closed[0][0] < now - CLOSED_CONNECTION_MEMORY_NS:
            _, flow = closed.popleft()
            for key in flow.keys:
                entry = self.flows.get(key)
                if entry is not None and entry[0] is flow:
                    del self.flows[key]

    def open_connection(
        self, ts: int, client: tuple[bytes, int], server: tuple[bytes, int], handshake: bool
    ) -> tuple[tuple[_Fanout, _Fanout], list[tuple[int, int, int]]]:
        """Emit a ConnOpen for each traced side; return the flow's fanout
        (from server, from client) and its sides."""
        self.flush_chunk()
        family = socket.AF_INET if len(server[0]) == 4 else socket.AF_INET6
        client_ip, server_ip = format_ip(client[0]), format_ip(server[0])
        from_client: list[tuple[int, int, int, Direction]] = []
        from_server: list[tuple[int, int, int, Direction]] = []
        sides: list[tuple[int, int, int]] = []
        if self.trace_clients:
            pid = self.processes.pid_for("client", client[0], None)
            fd, conn_id = self.processes.open_socket(pid)
            hint = RoleHint.CONNECTED if handshake else RoleHint.UNKNOWN
            self.out.append(ConnOpen(ts, pid, pid, fd, conn_id, family, client_ip, client[1], server_ip, server[1], hint))
            sides.append((pid, fd, conn_id))
            from_client.append((pid, fd, conn_id, Direction.EGRESS))
            from_server.append((pid, fd, conn_id, Direction.INGRESS))
        if self.trace_servers:
            pid = self.processes.pid_for("server", server[0], server[1])
            fd, conn_id = self.processes.open_socket(pid)
            hint = RoleHint.ACCEPTED if handshake else RoleHint.UNKNOWN
            self.out.append(ConnOpen(ts, pid, pid, fd, conn_id, family, server_ip, server[1], client_ip, client[1], hint))
            sides.append((pid, fd, conn_id))
            from_client.append((pid, fd, conn_id, Direction.INGRESS))
            from_server.insert(0, (pid, fd, conn_id, Direction.EGRESS))
        return (tuple(from_server), tuple(from_client)), sides

    def close(self, flow: _Flow, ts: int) -> None:
        """The connection ended (both FINs, a RST, reuse, or end of file):
        flush both directions, then a ConnClose per traced side."""
        for stream, from_client in ((flow.to_server, True), (flow.to_client, False)):
            pieces: list[Piece] = []
            stream.finish(ts, pieces)
            if pieces:
                self.emit(flow, from_client, pieces)
        self.flush_chunk()
        for pid, fd, conn_id in flow.sides:
            self.out.append(ConnClose(ts, pid, pid, fd, conn_id))
            self.processes.close_socket(pid, fd)
        flow.closed_at = ts
        del self.open_flows[flow]
        self.recently_closed.append((ts, flow))

    def emit(self, flow: _Flow, from_client: bool, pieces: list[Piece]) -> None:
        """Turn stream pieces into DataEvents for every traced side."""
        if self.capture_bytes is not None:
            self.gather(flow, from_client, pieces)
            return
        fanout, out = flow.fanout[from_client], self.out
        for ts, data, missing in pieces:
            if missing:
                self.stats["missing_bytes"] += missing
            total = len(data) + missing
            for pid, fd, conn_id, direction in fanout:
                out.append(DataEvent(ts, pid, pid, fd, conn_id, direction, total, data))

    def gather(self, flow: _Flow, from_client: bool, pieces: list[Piece]) -> None:
        """Coalesce pieces into chunks of up to ``capture_bytes`` captured
        bytes. A chunk ends when full, when missing bytes follow it (they can
        only trail an event's data), or when any other event must go out
        first, which keeps the output in timestamp order."""
        limit = self.capture_bytes
        assert limit is not None
        chunk = self.chunk
        if chunk is not None and (chunk.flow is not flow or chunk.from_client != from_client):
            self.flush_chunk()
            chunk = None
        for ts, data, missing in pieces:
            self.stats["missing_bytes"] += missing
            while data:
                if chunk is None:
                    chunk = self.chunk = _Chunk(flow, from_client, ts)
                room = limit - chunk.size
                chunk.parts.append(data[:room])
                chunk.size += min(room, len(data))
                data = data[room:]
                if chunk.size == limit:
                    self.flush_chunk()
                    chunk = None
            if missing:
                if chunk is None:
                    chunk = self.chunk = _Chunk(flow, from_client, ts)
                chunk.missing = missing
                self.flush_chunk()
                chunk = None

    def flush_chunk(self) -> None:
        chunk = self.chunk
        if chunk is None:
            return
        self.chunk = None
        data = b"".join(chunk.parts)
        total = chunk.size + chunk.missing
        for pid, fd, conn_id, direction in chunk.flow.fanout[chunk.from_client]:
            self.out.append(DataEvent(chunk.ts, pid, pid, fd, conn_id, direction, total, data))
