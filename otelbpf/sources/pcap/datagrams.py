"""UDP: datagrams as the sockets that sent and received them saw them.

Each datagram becomes one :class:`~otelbpf.core.events.DatagramEvent` per traced
side: the sender's socket wrote it (EGRESS), the receiver's read it
(INGRESS), each with the other end's address and port. Nothing is
reassembled across datagrams (UDP keeps message boundaries); a datagram cut
by the snap length carries what was captured and counts the rest as
``missing``. IPv4 fragments are put back together here (:class:`Ipv4Fragments`)
before the datagram is decoded; IPv6 fragments are counted and dropped.

Sockets. Every (ip, port) that sends or receives a datagram is one socket of
a synthetic process (the same processes TCP replay uses, see
``otelbpf.sources.pcap.replay``): the first time a traced process's socket
is seen, a :class:`~otelbpf.core.events.ConnOpen` names its family and local
address and port, with no peer (replayed sockets are unconnected: one
socket talks to any number of peers, named per datagram); a
:class:`~otelbpf.core.events.ConnClose` ends each at the end of the capture. The
role hint is UNKNOWN: a capture shows no bind() or connect().

Which side is the server, decided per pair of endpoints at its first
datagram and kept: an endpoint that is already a server to another peer;
else, if exactly one of the two ports is privileged (below 1024: DNS, NTP,
syslog, SNMP...), that one; else the receiver of the first datagram (the
client speaks first). As for TCP, the server is the process (ip, port) and
the client is the process of its ip, whatever ephemeral ports it used.

Multicast and broadcast datagrams (to 224.0.0.0/4, 255.255.255.255 or
ff00::/8) are replayed from the sender's side only, whatever the
perspective: the capture holds the packet once and cannot say which hosts
received it. The sender is its (ip, port) server process if that endpoint
is already a server, else its ip's client process.
"""

from __future__ import annotations

import socket
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from otelbpf.core.events import ConnClose, ConnOpen, DatagramEvent, RoleHint
from protocols.base import Direction

if TYPE_CHECKING:
    from otelbpf.sources.pcap.replay import _Replay

#: IPv4 fragments of one datagram are given up on this long after the first
#: arrived (Linux's ipfrag_time), or when more datagrams than this are being
#: put together at once (the oldest goes).
FRAGMENT_TIMEOUT_NS = 30 * 1_000_000_000
MAX_PENDING_DATAGRAMS = 1024

_IP_MORE_FRAGMENTS = 0x2000
_IP_OFFSET_MASK = 0x1FFF

#: An endpoint: (ip bytes, port).
UdpEndpoint = tuple[bytes, int]


@dataclass(frozen=True, slots=True)
class Datagram:
    """A decoded UDP datagram: addresses, the captured payload, and payload
    bytes on the wire but not captured."""

    src: bytes
    sport: int
    dst: bytes
    dport: int
    payload: bytes
    missing: int


def is_group_address(ip: bytes) -> bool:
    """Multicast (IPv4 224.0.0.0/4, IPv6 ff00::/8) or the IPv4 limited broadcast."""
    if len(ip) == 4:
        return 224 <= ip[0] <= 239 or ip == b"\xff\xff\xff\xff"
    return ip[0] == 0xFF


@dataclass(slots=True)
class _Pending:
    """The fragments of one IPv4 datagram seen so far."""

    first_ts: int
    pieces: dict[int, bytes] = field(default_factory=dict)  # offset -> bytes
    total: int | None = None  # payload length, once the last fragment is seen
    broken: bool = False  # a fragment was cut by the snap length: cannot finish


class Ipv4Fragments:
    """IPv4 fragments (of TCP or UDP) waiting for the rest of their datagram.

    Keyed as the receiving kernel keys them (source, destination, IP id,
    protocol); overlapping fragments keep the first copy of each offset.
    Datagrams never completed (a fragment lost or cut by the snap length,
    timed out, evicted, or pending at the end of the capture) count their
    fragments in ``fragments_dropped``.
    """

    def __init__(self, stats: dict[str, int]) -> None:
        self.stats = stats
        self.pending: OrderedDict[tuple[bytes, bytes, int, int], _Pending] = OrderedDict()

    def add(self, ts: int, ip, packet: bytes) -> bytes | None:
        """Take in fragment ``ip`` (a dpkt IP decoded from ``packet``); the
        whole IP payload (transport header included) once complete."""
        self._expire(ts)
        key = (ip.src, ip.dst, ip.id, ip.p)
        pending = self.pending.get(key)
        if pending is None:
            pending = self.pending[key] = _Pending(ts)
            while len(self.pending) > MAX_PENDING_DATAGRAMS:
                self._drop(next(iter(self.pending)))
        header = ip.hl << 2
        end = ip.len or len(packet)
        piece = packet[header:end]
        if len(piece) < end - header:
            pending.broken = True
        offset = (ip._flags_offset & _IP_OFFSET_MASK) << 3
        pending.pieces.setdefault(offset, piece)
        if not ip._flags_offset & _IP_MORE_FRAGMENTS:
            pending.total = offset + end - header
        if pending.broken or pending.total is None:
            return None
        position = 0
        for start in sorted(pending.pieces):
            if start > position:
                return None  # a hole
            position = max(position, start + len(pending.pieces[start]))
        if position < pending.total:
            return None
        whole = bytearray(pending.total)
        for start in sorted(pending.pieces, reverse=True):  # the lowest offset's bytes win overlaps
            piece = pending.pieces[start][: max(0, pending.total - start)]
            whole[start : start + len(piece)] = piece
        del self.pending[key]
        return bytes(whole)

    def finish(self) -> None:
        """End of the capture: what is still pending will never complete."""
        for key in list(self.pending):
            self._drop(key)

    def _expire(self, now: int) -> None:
        pending = self.pending
        while pending:
            key, oldest = next(iter(pending.items()))
            if oldest.first_ts >= now - FRAGMENT_TIMEOUT_NS:
                return
            self._drop(key)

    def _drop(self, key: tuple[bytes, bytes, int, int]) -> None:
        self.stats["fragments_dropped"] += len(self.pending.pop(key).pieces)


@dataclass(slots=True)
class _Socket:
    pid: int
    fd: int
    conn_id: int
    local_addr: str
    local_port: int


class UdpSockets:
    """The UDP sockets of one replay: roles, sockets, and their events (see
    the module doc). ``replay`` provides the synthetic processes, their file
    descriptors, connection ids, the perspective and the output list."""

    def __init__(self, replay: _Replay) -> None:
        self.replay = replay
        self.servers: set[UdpEndpoint] = set()
        #: Both orders of each endpoint pair seen -> its server endpoint.
        self.pairs: dict[tuple[UdpEndpoint, UdpEndpoint], UdpEndpoint] = {}
        self.sockets: dict[tuple[int, bytes, int], _Socket] = {}

    def on_datagram(self, ts: int, datagram: Datagram) -> None:
        replay = self.replay
        replay.flush_chunk()  # stream bytes gathered so far go first, in time order
        src, dst = (datagram.src, datagram.sport), (datagram.dst, datagram.dport)
        family = socket.AF_INET if len(datagram.src) == 4 else socket.AF_INET6
        total = len(datagram.payload) + datagram.missing
        if datagram.missing:
            replay.stats["missing_bytes"] += datagram.missing
        sides: list[tuple[_Socket, Direction, UdpEndpoint]] = []
        if is_group_address(datagram.dst):
            replay.stats["multicast_datagrams"] += 1
            role = "server" if src in self.servers else "client"
            sides.append((self.socket(ts, role, src, family), Direction.EGRESS, dst))
        else:
            server = self.server_of(src, dst)
            sender_role, receiver_role = ("server", "client") if server == src else ("client", "server")
            for role, endpoint, direction, peer in (
                (sender_role, src, Direction.EGRESS, dst),
                (receiver_role, dst, Direction.INGRESS, src),
            ):
                if replay.trace_servers if role == "server" else replay.trace_clients:
                    sides.append((self.socket(ts, role, endpoint, family), direction, peer))
        out = replay.out
        for sock, direction, (peer_ip, peer_port) in sides:
            out.append(DatagramEvent(
                ts, sock.pid, sock.pid, sock.fd, sock.conn_id, direction, total, datagram.payload,
                replay.format_ip(peer_ip), peer_port, family,
            ))

    def server_of(self, src: UdpEndpoint, dst: UdpEndpoint) -> UdpEndpoint:
        """Which of the two endpoints is the server (decided once per pair)."""
        server = self.pairs.get((src, dst))
        if server is not None:
            return server
        src_known, dst_known = src in self.servers, dst in self.servers
        if src_known != dst_known:
            server = src if src_known else dst
        elif (src[1] < 1024) != (dst[1] < 1024):
            server = src if src[1] < 1024 else dst
        else:
            server = dst  # the first receiver
        self.pairs[(src, dst)] = self.pairs[(dst, src)] = server
        self.servers.add(server)
        return server

    def socket(self, ts: int, role: str, endpoint: UdpEndpoint, family: int) -> _Socket:
        """The traced socket at ``endpoint``, opened (ConnOpen) on first sight."""
        replay = self.replay
        ip, port = endpoint
        pid = replay.pid_for(role, ip, port if role == "server" else None)
        key = (pid, ip, port)
        sock = self.sockets.get(key)
        if sock is None:
            fd, conn_id = replay.fds[pid].allocate(), replay.next_conn_id()
            sock = self.sockets[key] = _Socket(pid, fd, conn_id, replay.format_ip(ip), port)
            replay.stats["udp_sockets"] += 1
            replay.out.append(ConnOpen(ts, pid, pid, fd, conn_id, family, sock.local_addr, port, "", 0, RoleHint.UNKNOWN))
        return sock

    def close_all(self, ts: int) -> None:
        """End of the capture: a ConnClose for every socket, in opening order."""
        for sock in self.sockets.values():
            self.replay.out.append(ConnClose(ts, sock.pid, sock.pid, sock.fd, sock.conn_id))
            self.replay.fds[sock.pid].release(sock.fd)
        self.sockets.clear()
