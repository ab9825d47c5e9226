"""UDP: datagrams as the sockets that sent and received them saw them.

Each datagram becomes one :class:`~otelbpf.core.events.DatagramEvent` per traced
side: the sender's socket wrote it (EGRESS), the receiver's read it
(INGRESS), each with the other end's address and port. Nothing is
reassembled across datagrams (UDP keeps message boundaries); a datagram cut
by the snap length carries what was captured and counts the rest as
``missing``. IPv4 fragments were put back together before the datagram was
decoded (``otelbpf.sources.pcap.fragments``); IPv6 fragments are counted
and dropped.

Sockets. Every (ip, port) that sends or receives a datagram is one socket of
a synthetic process (the same processes TCP replay uses, see
``otelbpf.sources.pcap.processes``): the first time a traced process's socket
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
from dataclasses import dataclass

from otelbpf.core.events import ConnClose, ConnOpen, DatagramEvent, Event, RoleHint
from otelbpf.sources.pcap.link import Datagram
from otelbpf.sources.pcap.processes import SyntheticProcesses, format_ip
from protocols.base import Direction

#: An endpoint: (ip bytes, port).
UdpEndpoint = tuple[bytes, int]


def is_group_address(ip: bytes) -> bool:
    """Multicast (IPv4 224.0.0.0/4, IPv6 ff00::/8) or the IPv4 limited broadcast."""
    if len(ip) == 4:
        return 224 <= ip[0] <= 239 or ip == b"\xff\xff\xff\xff"
    return ip[0] == 0xFF


@dataclass(slots=True)
class _Socket:
    pid: int
    fd: int
    conn_id: int
    local_addr: str
    local_port: int


class UdpSockets:
    """The UDP sockets of one replay: roles, sockets, and their events (see
    the module doc). The sockets belong to ``processes``, the replay's
    synthetic processes; their events go to ``out``, in capture order, and the
    counters to ``stats``. ``trace_servers``, ``trace_clients``: the
    replay's perspective."""

    def __init__(
        self,
        processes: SyntheticProcesses,
        out: list[Event],
        stats: dict[str, int],
        trace_servers: bool,
        trace_clients: bool,
    ) -> None:
        self.processes = processes
        self.out = out
        self.stats = stats
        self.trace_servers = trace_servers
        self.trace_clients = trace_clients
        self.servers: set[UdpEndpoint] = set()
        #: Both orders of each endpoint pair seen -> its server endpoint.
        self.pairs: dict[tuple[UdpEndpoint, UdpEndpoint], UdpEndpoint] = {}
        self.sockets: dict[tuple[int, bytes, int], _Socket] = {}

    def on_datagram(self, ts: int, datagram: Datagram) -> None:
        """Events for the traced sides of one datagram (the caller first puts
        out any stream bytes gathered before it)."""
        src, dst = (datagram.src, datagram.sport), (datagram.dst, datagram.dport)
        family = socket.AF_INET if len(datagram.src) == 4 else socket.AF_INET6
        total = len(datagram.payload) + datagram.missing
        if datagram.missing:
            self.stats["missing_bytes"] += datagram.missing
        sides: list[tuple[_Socket, Direction, UdpEndpoint]] = []
        if is_group_address(datagram.dst):
            self.stats["multicast_datagrams"] += 1
            role = "server" if src in self.servers else "client"
            sides.append((self.socket(ts, role, src, family), Direction.EGRESS, dst))
        else:
            server = self.server_of(src, dst)
            sender_role, receiver_role = ("server", "client") if server == src else ("client", "server")
            for role, endpoint, direction, peer in (
                (sender_role, src, Direction.EGRESS, dst),
                (receiver_role, dst, Direction.INGRESS, src),
            ):
                if self.trace_servers if role == "server" else self.trace_clients:
                    sides.append((self.socket(ts, role, endpoint, family), direction, peer))
        out = self.out
        for sock, direction, (peer_ip, peer_port) in sides:
            out.append(DatagramEvent(
                ts, sock.pid, sock.pid, sock.fd, sock.conn_id, direction, total, datagram.payload,
                format_ip(peer_ip), peer_port, family,
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
        ip, port = endpoint
        pid = self.processes.pid_for(role, ip, port if role == "server" else None)
        key = (pid, ip, port)
        sock = self.sockets.get(key)
        if sock is None:
            fd, conn_id = self.processes.open_socket(pid)
            sock = self.sockets[key] = _Socket(pid, fd, conn_id, format_ip(ip), port)
            self.stats["udp_sockets"] += 1
            self.out.append(ConnOpen(ts, pid, pid, fd, conn_id, family, sock.local_addr, port, "", 0, RoleHint.UNKNOWN))
        return sock

    def close_all(self, ts: int) -> None:
        """End of the capture: a ConnClose for every socket, in opening order."""
        for sock in self.sockets.values():
            self.out.append(ConnClose(ts, sock.pid, sock.pid, sock.fd, sock.conn_id))
            self.processes.close_socket(sock.pid, sock.fd)
        self.sockets.clear()
