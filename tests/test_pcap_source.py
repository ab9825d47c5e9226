"""PcapSource: replaying captures as the traced processes would have seen them.

Two kinds of input: real captures recorded by scripts/record_pcaps.sh (see
tests/data/README.md), checked byte for byte against what the servers sent
and curl received; and small synthetic captures built here with dpkt, to
put reassembly through what loopback never does (loss, reordering,
retransmission, wraparound) and to cover every file and link format.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Callable

import dpkt
import pytest
from hypothesis import given, settings, strategies as st

from otelbpf.core.events import ConnClose, ConnOpen, DataEvent, DatagramEvent, Event, RoleHint
from otelbpf.sources.pcap import Endpoint, PcapError, PcapSource, Perspective, link, replay as pcap_replay, streams
from otelbpf.sources.pcap.fragments import Ipv4Fragments
from protocols.base import Direction

DATA = Path(__file__).parent / "data"
USER_AGENT = b"otelbpf-pcap-recorder"
FIN, SYN, RST, PSH, ACK = dpkt.tcp.TH_FIN, dpkt.tcp.TH_SYN, dpkt.tcp.TH_RST, dpkt.tcp.TH_PUSH, dpkt.tcp.TH_ACK


def make_body(name: str, size: int) -> bytes:
    """The bodies scripts/record_pcaps.sh serves (its make_body)."""
    return "".join(f"{name} line {i:05d}\n" for i in range(size // 10 + 1))[:size].encode()


def curl_get(path: str, host: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: ".encode() + USER_AGENT + b"\r\nAccept: */*\r\n\r\n"


# --- reading replays ------------------------------------------------------------


@dataclass
class Conn:
    """Everything one traced side saw of one connection."""

    open: ConnOpen
    data: list[DataEvent] = field(default_factory=list)
    close: ConnClose | None = None
    datagrams: list[DatagramEvent] = field(default_factory=list)  # UDP sockets

    def stream(self, direction: Direction) -> bytes:
        """The captured bytes; raises if any were missing (use layout())."""
        events = [e for e in self.data if e.direction == direction]
        assert all(e.missing == 0 for e in events), "stream has missing bytes"
        return b"".join(e.data for e in events)

    def layout(self, direction: Direction) -> list[tuple[int, bytes, int]]:
        """(stream offset, captured bytes, missing after them) per event."""
        offset, out = 0, []
        for e in self.data:
            if e.direction == direction:
                out.append((offset, e.data, e.missing))
                offset += e.total_len
        return out

    def total(self, direction: Direction) -> int:
        return sum(e.total_len for e in self.data if e.direction == direction)


def connections(events: list[Event]) -> dict[int, Conn]:
    """Group events by conn_id, checking what the pipeline relies on: one
    ConnOpen first, DataEvents, one ConnClose last, ids consistent, and the
    whole output in timestamp order."""
    conns: dict[int, Conn] = {}
    last_ts = 0
    for event in events:
        assert event.ts_ns >= last_ts, f"out of timestamp order: {event}"
        last_ts = event.ts_ns
        assert event.tid == event.pid
        if isinstance(event, ConnOpen):
            assert event.conn_id not in conns
            conns[event.conn_id] = Conn(event)
            continue
        conn = conns[event.conn_id]
        assert conn.close is None, f"event after ConnClose: {event}"
        assert (event.pid, event.fd) == (conn.open.pid, conn.open.fd)
        if isinstance(event, DataEvent):
            assert 0 <= len(event.data) <= event.total_len and event.total_len > 0
            conn.data.append(event)
        elif isinstance(event, DatagramEvent):
            assert 0 <= len(event.data) <= event.total_len
            assert event.family == conn.open.family and event.peer_port
            conn.datagrams.append(event)
        else:
            assert isinstance(event, ConnClose)
            conn.close = event
    assert all(c.close is not None for c in conns.values()), "a connection was never closed"
    return conns


def replay(
    path: Path, perspective: Perspective = "server", capture_bytes: int | None = None
) -> tuple[PcapSource, dict[int, Conn]]:
    source = PcapSource(path, perspective, capture_bytes)
    events = list(source.events())
    return source, connections(events)


def split_http(stream: bytes) -> list[tuple[bytes, bytes]]:
    """(head, body) of each Content-Length-delimited message in ``stream``."""
    messages = []
    while stream:
        head, _, rest = stream.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
        )
        messages.append((head, rest[:length]))
        stream = rest[length:]
    return messages


def dechunk(body: bytes) -> bytes:
    out = b""
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        out, body = out + body[:size], body[size + 2 :]
        if size == 0:
            return out


# --- the recorded captures ------------------------------------------------------


def test_http_get_two_connections_byte_exact() -> None:
    source, conns = replay(DATA / "http_get.pcap")
    assert source.endpoints == {1: Endpoint(1, "server", "127.0.0.1", 18080, "127.0.0.1:18080")}
    assert len(conns) == 2
    ok, missing = conns.values()
    assert ok.stream(Direction.INGRESS) == curl_get("/small.txt", "127.0.0.1:18080")
    [(head, body)] = split_http(ok.stream(Direction.EGRESS))
    assert head.startswith(b"HTTP/1.0 200 OK\r\n") and body == make_body("small", 2000)
    assert missing.stream(Direction.INGRESS) == curl_get("/missing.txt", "127.0.0.1:18080")
    head, _, page = missing.stream(Direction.EGRESS).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 404 File not found\r\n") and page.rstrip().endswith(b"</html>")
    assert source.stats["packets"] == source.stats["tcp_segments"] > 20
    assert source.stats["connections"] == 2
    assert sum(source.stats[k] for k in ("retransmits", "out_of_order", "holes", "missing_bytes", "unsupported", "udp_datagrams")) == 0


def test_server_conn_open_describes_the_accepted_socket() -> None:
    _, conns = replay(DATA / "http_get.pcap")
    first, second = (c.open for c in conns.values())
    assert (first.family, first.local_addr, first.local_port, first.peer_addr) == (
        socket.AF_INET, "127.0.0.1", 18080, "127.0.0.1")
    assert first.role_hint == RoleHint.ACCEPTED
    assert first.peer_port != second.peer_port  # two ephemeral client ports
    assert first.fd == second.fd == 3  # the first closed before the second opened
    assert first.ts_ns > 1_700_000_000 * 10**9  # unix-epoch nanoseconds


def test_keepalive_three_requests_on_one_connection() -> None:
    source, conns = replay(DATA / "http_keepalive.pcap")
    [conn] = conns.values()
    host = "127.0.0.1:18081"
    requests = [e.data for e in conn.data if e.direction == Direction.INGRESS]
    assert requests == [curl_get(p, host) for p in ("/a.txt", "/b.txt", "/c.txt")]
    responses = split_http(conn.stream(Direction.EGRESS))
    assert [body for _, body in responses] == [make_body("a", 300), make_body("b", 5000), make_body("c", 100)]
    assert all(head.startswith(b"HTTP/1.1 200 OK\r\n") for head, _ in responses)


def test_chunked_post_streamed_in_parts() -> None:
    _, conns = replay(DATA / "http_post_chunked.pcap")
    [conn] = conns.values()
    request = conn.stream(Direction.INGRESS)
    head, _, body = request.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /echo HTTP/1.1\r\n") and b"\r\nTransfer-Encoding: chunked" in head
    sent = b"first part\nsecond part\nthird part\n"
    assert dechunk(body) == sent
    assert len([e for e in conn.data if e.direction == Direction.INGRESS]) >= 4  # head, then chunk by chunk
    [(response_head, echoed)] = split_http(conn.stream(Direction.EGRESS))
    assert response_head.startswith(b"HTTP/1.1 200 OK\r\n") and echoed == sent


def test_nginx_large_response_over_several_segments() -> None:
    _, conns = replay(DATA / "nginx_large.pcap")
    [conn] = conns.values()
    assert conn.stream(Direction.INGRESS) == curl_get("/large.txt", "127.0.0.1:18082")
    [(head, body)] = split_http(conn.stream(Direction.EGRESS))
    assert head.startswith(b"HTTP/1.1 200 OK\r\nServer: nginx\r\n") and body == make_body("large", 48000)
    assert len([e for e in conn.data if e.direction == Direction.EGRESS]) >= 3


def test_ipv6_loopback() -> None:
    source, conns = replay(DATA / "http_ipv6.pcap")
    [conn] = conns.values()
    assert source.endpoints[1] == Endpoint(1, "server", "::1", 18083, "[::1]:18083")
    assert (conn.open.family, conn.open.local_addr, conn.open.peer_addr) == (socket.AF_INET6, "::1", "::1")
    assert conn.stream(Direction.INGRESS) == curl_get("/small.txt", "[::1]:18083")
    assert split_http(conn.stream(Direction.EGRESS))[0][1] == make_body("small", 2000)


@pytest.mark.parametrize("name", ["sll.pcap", "sll2.pcap"])
def test_linux_cooked_captures(name: str) -> None:
    _, conns = replay(DATA / name)
    [conn] = conns.values()
    assert conn.stream(Direction.INGRESS) == curl_get("/small.txt", "127.0.0.1:18080")
    assert split_http(conn.stream(Direction.EGRESS))[0][1] == make_body("small", 2000)


def test_snaplen_cut_bodies_are_reported_missing() -> None:
    source, conns = replay(DATA / "snaplen200.pcap")
    [conn] = conns.values()
    assert conn.stream(Direction.INGRESS) == curl_get("/large.txt", "127.0.0.1:18082")
    layout = conn.layout(Direction.EGRESS)
    head_length = conn.total(Direction.EGRESS) - 48000
    assert layout[0][1].startswith(b"HTTP/1.1 200 OK\r\n")
    body = make_body("large", 48000)
    for offset, captured, _ in layout[1:]:  # every captured slice is the true bytes at its offset
        assert captured and captured == body[offset - head_length : offset - head_length + len(captured)]
    assert all(missing > 0 for _, _, missing in layout)
    assert all(len(captured) <= 200 for _, captured, _ in layout)
    assert source.stats["truncated_packets"] == len(layout)
    assert source.stats["missing_bytes"] == sum(missing for _, _, missing in layout)
    assert source.stats["holes"] == 0


# --- perspectives -----------------------------------------------------------------


def test_client_perspective_mirrors_the_server() -> None:
    _, servers = replay(DATA / "http_keepalive.pcap", "server")
    source, clients = replay(DATA / "http_keepalive.pcap", "client")
    [server], [client] = servers.values(), clients.values()
    assert source.endpoints == {1: Endpoint(1, "client", "127.0.0.1", None, "client 127.0.0.1")}
    assert client.open.role_hint == RoleHint.CONNECTED
    assert (client.open.local_port, client.open.peer_port) == (server.open.peer_port, 18081)
    assert client.stream(Direction.EGRESS) == server.stream(Direction.INGRESS)
    assert client.stream(Direction.INGRESS) == server.stream(Direction.EGRESS)


def test_both_perspectives_sender_first() -> None:
    source, conns = replay(DATA / "http_get.pcap", "both")
    assert [e.role for e in source.endpoints.values()] == ["client", "server"]
    assert len(conns) == 4 and len({c.open.conn_id for c in conns.values()}) == 4
    events = list(PcapSource(DATA / "http_get.pcap", "both").events())
    data = [e for e in events if isinstance(e, DataEvent)]
    for write, read in zip(data[::2], data[1::2]):  # each piece: the writer's EGRESS, then the reader's INGRESS
        assert (write.direction, read.direction) == (Direction.EGRESS, Direction.INGRESS)
        assert (write.data, write.ts_ns) == (read.data, read.ts_ns) and write.pid != read.pid


def test_endpoint_known_before_its_first_event() -> None:
    source = PcapSource(DATA / "http_get.pcap", "both")
    for event in source.events():
        assert event.pid in source.endpoints


def test_events_can_be_replayed_again() -> None:
    source = PcapSource(DATA / "http_get.pcap")
    first = list(source.events())
    assert list(source.events()) == first
    assert source.stats["connections"] == 2  # counted afresh, not added to the first pass


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.pcap") if not p.name.startswith("udp_")))
def test_every_mode_gives_the_same_streams(name: str) -> None:
    """Whatever the perspective and chunking, each connection carries the
    same bytes (and as many missing bytes) each way."""

    def flows(perspective: Perspective, capture_bytes: int | None = None) -> dict[bool, list[tuple]]:
        """Per side (True: servers), each connection's (client->server, server->client)."""
        _, conns = replay(DATA / name, perspective, capture_bytes)
        sides: dict[bool, list[tuple]] = {True: [], False: []}
        for conn in conns.values():
            is_server = conn.open.role_hint == RoleHint.ACCEPTED
            to_server, to_client = (Direction.INGRESS, Direction.EGRESS) if is_server else (Direction.EGRESS, Direction.INGRESS)
            sides[is_server].append(tuple(
                (b"".join(e.data for e in conn.data if e.direction == d), conn.total(d)) for d in (to_server, to_client)
            ))
        return sides

    servers, clients = flows("server")[True], flows("client")[False]
    assert servers and servers == clients
    assert flows("both") == flows("both", 1000) == {True: servers, False: clients}


# --- capture_bytes: coalescing --------------------------------------------------


def test_capture_bytes_coalesces_a_direction_into_chunks() -> None:
    _, plain = replay(DATA / "nginx_large.pcap")
    _, chunked = replay(DATA / "nginx_large.pcap", capture_bytes=4096)
    [plain_conn], [conn] = plain.values(), chunked.values()
    egress = [e for e in conn.data if e.direction == Direction.EGRESS]
    assert all(len(e.data) == e.total_len <= 4096 for e in egress)
    assert all(len(e.data) == 4096 for e in egress[:-1])
    assert conn.stream(Direction.EGRESS) == plain_conn.stream(Direction.EGRESS)
    _, whole = replay(DATA / "nginx_large.pcap", capture_bytes=1 << 20)
    [conn] = whole.values()
    assert [e.direction for e in conn.data] == [Direction.INGRESS, Direction.EGRESS]


def test_capture_bytes_keeps_missing_bytes_at_chunk_ends() -> None:
    _, plain = replay(DATA / "snaplen200.pcap")
    _, chunked = replay(DATA / "snaplen200.pcap", capture_bytes=1000)
    [plain_conn], [conn] = plain.values(), chunked.values()
    assert conn.layout(Direction.EGRESS) == plain_conn.layout(Direction.EGRESS)  # each cut ends a chunk


# --- synthetic captures -----------------------------------------------------------

CLIENT = ("10.0.0.1", 40000)
SERVER = ("10.0.0.2", 8080)
T0 = 1_700_000_000


def ip_packet(src: tuple[str, int], dst: tuple[str, int], seq: int, ack: int, flags: int, payload: bytes) -> bytes:
    tcp = dpkt.tcp.TCP(sport=src[1], dport=dst[1], seq=seq % 2**32, ack=ack % 2**32, flags=flags, data=payload)
    if ":" in src[0]:
        return bytes(dpkt.ip6.IP6(
            src=socket.inet_pton(socket.AF_INET6, src[0]), dst=socket.inet_pton(socket.AF_INET6, dst[0]),
            nxt=dpkt.ip.IP_PROTO_TCP, hlim=64, plen=len(bytes(tcp)), data=tcp))
    return bytes(dpkt.ip.IP(src=socket.inet_aton(src[0]), dst=socket.inet_aton(dst[0]), p=dpkt.ip.IP_PROTO_TCP, data=tcp))


def ethernet(packet: bytes) -> bytes:
    ethertype = 0x86DD if packet[0] >> 4 == 6 else 0x0800
    return b"\x02" * 6 + b"\x04" * 6 + struct.pack(">H", ethertype) + packet


class Conversation:
    """The packets of one TCP connection, with sequence numbers kept right.
    Stream offsets count from the first byte after the SYN."""

    def __init__(self, client=CLIENT, server=SERVER, client_isn: int = 1000, server_isn: int = 50000) -> None:
        self.ends = {True: client, False: server}
        self.isn = {True: client_isn, False: server_isn}
        self.sent = {True: 0, False: 0}  # stream bytes each side has sent (built) so far

    def packet(self, from_client: bool, flags: int, payload: bytes = b"", offset: int | None = None,
               ack: int | None = None) -> bytes:
        offset = self.sent[from_client] if offset is None else offset
        self.sent[from_client] = max(self.sent[from_client], offset + len(payload))
        acked = self.sent[not from_client] if ack is None else ack
        seq = self.isn[from_client] + 1 + offset
        ack_number = self.isn[not from_client] + 1 + acked
        return ip_packet(self.ends[from_client], self.ends[not from_client], seq, ack_number, flags, payload)

    def handshake(self) -> list[bytes]:
        """SYN, SYN-ACK, ACK (whenever built: they carry no data)."""
        c, s = self.ends[True], self.ends[False]
        return [
            ip_packet(c, s, self.isn[True], 0, SYN, b""),
            ip_packet(s, c, self.isn[False], self.isn[True] + 1, SYN | ACK, b""),
            self.packet(True, ACK, offset=0, ack=0),
        ]

    def send(self, from_client: bool, payload: bytes, offset: int | None = None, ack: int | None = None) -> bytes:
        return self.packet(from_client, ACK | PSH, payload, offset, ack)

    def fin(self, from_client: bool) -> bytes:
        return self.packet(from_client, FIN | ACK)

    def closing(self) -> list[bytes]:
        return [self.fin(True), self.fin(False)]


def write_pcap(path: Path, packets: list[bytes], linktype: int = dpkt.pcap.DLT_EN10MB,
               frame: Callable[[bytes], bytes] = ethernet, snaplen: int = 65535) -> Path:
    with path.open("wb") as f:
        writer = dpkt.pcap.Writer(f, snaplen=snaplen, linktype=linktype)
        for i, packet in enumerate(packets):
            writer.writepkt(frame(packet), ts=T0 + i / 1000)
    return path


def ts_of(index: int) -> int:
    return (T0 * 1_000_000 + index * 1000) * 1000


def one_conn(path: Path) -> tuple[PcapSource, Conn]:
    """A replay (server perspective) of a capture holding one connection."""
    source, conns = replay(path)
    [conn] = conns.values()
    return source, conn


REQUEST = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
RESPONSE = [b"HTTP/1.1 200 OK\r\n", b"Content-Length: 20\r\n\r\n", b"0123456789", b"abcdefghij"]


def test_out_of_order_segments_are_put_back_in_order(tmp_path: Path) -> None:
    c = Conversation()
    request = c.send(True, REQUEST)
    r0, r1, r2, r3 = (c.send(False, part) for part in RESPONSE)
    packets = c.handshake() + [request, r0, r2, r3, r1] + c.closing()
    source, conn = one_conn(write_pcap(tmp_path / "ooo.pcap", packets))
    assert conn.stream(Direction.EGRESS) == b"".join(RESPONSE)
    egress = [e for e in conn.data if e.direction == Direction.EGRESS]
    assert [e.data for e in egress] == RESPONSE  # one DataEvent per segment
    assert [e.ts_ns for e in egress] == [ts_of(4), ts_of(7), ts_of(7), ts_of(7)]  # readable once the hole filled
    assert source.stats["out_of_order"] == 2 and source.stats["holes"] == 0


def test_duplicates_and_overlaps_are_dropped(tmp_path: Path) -> None:
    c = Conversation()
    request = c.send(True, REQUEST)
    body = b"".join(RESPONSE)
    packets = c.handshake() + [
        request,
        c.send(False, body[:20], offset=0),
        c.send(False, body[:20], offset=0),  # exact duplicate
        c.send(False, body[10:35], offset=10),  # overlaps the first, adds 15
        c.send(False, body[50:], offset=50),  # early
        c.send(False, body[30:55], offset=30),  # fills the hole, overlaps both sides
    ] + c.closing()
    source, conn = one_conn(write_pcap(tmp_path / "dup.pcap", packets))
    assert conn.stream(Direction.EGRESS) == body
    assert source.stats["retransmits"] == 3 and source.stats["out_of_order"] == 1


def test_lost_segment_acknowledged_by_the_receiver_is_a_hole(tmp_path: Path) -> None:
    c = Conversation()
    request = c.send(True, REQUEST)
    r0, _r1, r2, r3 = (c.send(False, part) for part in RESPONSE)
    ack = c.packet(True, ACK, ack=sum(map(len, RESPONSE[:3])))  # r1 included
    packets = c.handshake() + [request, r0, r2, ack, r3] + c.closing()  # r1 never captured
    source, conn = one_conn(write_pcap(tmp_path / "lost.pcap", packets))
    offsets = [len(RESPONSE[0]), len(RESPONSE[0]) + len(RESPONSE[1])]
    assert conn.layout(Direction.EGRESS) == [
        (0, RESPONSE[0], 0),
        (offsets[0], b"", len(RESPONSE[1])),
        (offsets[1], RESPONSE[2], 0),
        (offsets[1] + 10, RESPONSE[3], 0),
    ]
    hole = [e for e in conn.data if e.direction == Direction.EGRESS][1]
    assert hole.ts_ns == ts_of(6)  # when the ACK showed the bytes had passed
    assert (source.stats["holes"], source.stats["missing_bytes"]) == (1, len(RESPONSE[1]))


def test_hole_never_acknowledged_is_reported_at_close(tmp_path: Path) -> None:
    c = Conversation()
    request = c.send(True, REQUEST)
    r0, _r1, r2, _r3 = (c.send(False, part) for part in RESPONSE)
    c.send(False, b"tail")  # sent, never captured
    server_fin = c.fin(False)
    client_fin = c.packet(True, FIN | ACK, ack=len(RESPONSE[0]))  # acknowledges only r0
    packets = c.handshake() + [request, r0, r2, server_fin, client_fin]
    source, conn = one_conn(write_pcap(tmp_path / "unacked.pcap", packets))
    sizes = [len(p) for p in RESPONSE]
    assert conn.layout(Direction.EGRESS) == [
        (0, RESPONSE[0], 0),
        (sizes[0], b"", sizes[1]),
        (sizes[0] + sizes[1], RESPONSE[2], 0),
        (sum(sizes[:3]), b"", sizes[3] + 4),  # r3 and the tail: sent before the FIN, never seen
    ]
    assert conn.close is not None and conn.close.ts_ns == ts_of(7)


def test_out_of_order_buffer_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streams, "MAX_OUT_OF_ORDER_BYTES", 25)
    c = Conversation()
    request = c.send(True, REQUEST)
    parts = [bytes([65 + i]) * 10 for i in range(5)]
    segments = [c.send(False, part) for part in parts]
    packets = c.handshake() + [request] + segments[1:] + c.closing()  # the first never comes
    source, conn = one_conn(write_pcap(tmp_path / "bounded.pcap", packets))
    assert conn.layout(Direction.EGRESS) == [(0, b"", 10)] + [(10 * i, parts[i], 0) for i in range(1, 5)]
    assert [e.ts_ns for e in conn.data if e.direction == Direction.EGRESS][0] == ts_of(6)  # the third early one
    assert source.stats["holes"] == 1


def test_sequence_numbers_wrap_around(tmp_path: Path) -> None:
    c = Conversation(client_isn=2**32 - 7, server_isn=2**32 - 30)
    request = c.send(True, REQUEST)
    r0, r1, r2, r3 = (c.send(False, part) for part in RESPONSE)
    packets = c.handshake() + [request, r0, r2, r1, r3] + c.closing()
    source, conn = one_conn(write_pcap(tmp_path / "wrap.pcap", packets))
    assert conn.stream(Direction.INGRESS) == REQUEST
    assert conn.stream(Direction.EGRESS) == b"".join(RESPONSE)
    assert source.stats["holes"] == source.stats["retransmits"] == 0


def test_rst_closes_once_and_later_packets_are_ignored(tmp_path: Path) -> None:
    c = Conversation()
    packets = c.handshake() + [c.send(True, REQUEST), c.packet(False, RST | ACK), c.send(False, b"late")]
    _, conn = one_conn(write_pcap(tmp_path / "rst.pcap", packets))
    assert conn.close is not None and conn.close.ts_ns == ts_of(4)
    assert [e.data for e in conn.data] == [REQUEST]


def test_half_close_keeps_the_connection_open_until_end_of_file(tmp_path: Path) -> None:
    c = Conversation()
    packets = c.handshake() + [c.send(True, REQUEST), c.fin(True), c.send(False, RESPONSE[0]), c.packet(True, ACK)]
    _, conn = one_conn(write_pcap(tmp_path / "half.pcap", packets))
    assert conn.stream(Direction.EGRESS) == RESPONSE[0]
    assert conn.close is not None and conn.close.ts_ns == ts_of(6)  # the last packet in the file


def test_reused_four_tuple_is_a_new_connection(tmp_path: Path) -> None:
    first, second = Conversation(), Conversation(client_isn=7777, server_isn=8888)
    packets = (first.handshake() + [first.send(True, b"one")] + first.closing() + [first.packet(True, ACK)]
               + second.handshake() + [second.handshake()[0], second.send(True, b"two")] + second.closing())
    _, conns = replay(write_pcap(tmp_path / "reuse.pcap", packets))
    assert [c.stream(Direction.INGRESS) for c in conns.values()] == [b"one", b"two"]  # the SYN retransmit is no third


def test_capture_starting_mid_connection(tmp_path: Path) -> None:
    c = Conversation(client=("10.0.0.1", 40000), server=("10.0.0.2", 50051))
    c.sent[True] = 500  # 500 bytes went before the capture began
    known = Conversation(client=("10.0.0.3", 41000), server=("10.0.0.2", 50051))
    packets = known.handshake() + [
        c.packet(False, ACK),  # a bare ACK: not enough to start a connection
        c.send(True, REQUEST),
        c.send(False, RESPONSE[0]),
    ]
    source, conns = replay(write_pcap(tmp_path / "mid.pcap", packets))
    mid = next(conn for conn in conns.values() if conn.data)
    assert mid.open.role_hint == RoleHint.UNKNOWN
    assert (mid.open.local_port, mid.open.peer_port) == (50051, 40000)  # the higher port, but already a server
    assert (mid.stream(Direction.INGRESS), mid.stream(Direction.EGRESS)) == (REQUEST, RESPONSE[0])
    lone = Conversation(client=("10.0.0.1", 51000), server=("10.0.0.9", 9000))
    lone.sent[False] = 100
    source, conns = replay(write_pcap(tmp_path / "lone.pcap", [lone.send(False, RESPONSE[0])]))
    [conn] = conns.values()
    assert conn.open.local_port == 9000 and conn.stream(Direction.EGRESS) == RESPONSE[0]  # the lower port
    assert source.endpoints[1].service_name == "10.0.0.9:9000"


def test_capture_starting_at_the_syn_ack(tmp_path: Path) -> None:
    c = Conversation(client=("10.0.0.1", 1500), server=("10.0.0.2", 60000))  # the server has the higher port
    packets = c.handshake()[1:] + [c.send(True, REQUEST), c.send(False, RESPONSE[0])] + c.closing()
    _, conn = one_conn(write_pcap(tmp_path / "synack.pcap", packets))
    assert (conn.open.local_port, conn.open.role_hint) == (60000, RoleHint.ACCEPTED)
    assert (conn.stream(Direction.INGRESS), conn.stream(Direction.EGRESS)) == (REQUEST, RESPONSE[0])


def test_closed_connections_are_forgotten_after_a_while(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stray packet soon after the close is ignored; much later, data on
    the same addresses is a connection seen mid-way."""
    monkeypatch.setattr(pcap_replay, "CLOSED_CONNECTION_MEMORY_NS", 2_500_000)  # 2.5 packets apart
    c = Conversation()
    packets = c.handshake() + [c.send(True, b"one")] + c.closing()
    packets += [c.send(False, b"stray"), c.packet(True, ACK), c.packet(True, ACK), c.send(True, b"later")]
    _, conns = replay(write_pcap(tmp_path / "forget.pcap", packets))
    first, second = conns.values()
    assert first.stream(Direction.INGRESS) == b"one" and not first.stream(Direction.EGRESS)
    assert second.stream(Direction.INGRESS) == b"later" and second.open.role_hint == RoleHint.UNKNOWN


def test_lost_fin_is_not_a_missing_byte(tmp_path: Path) -> None:
    c = Conversation()
    request, response = c.send(True, REQUEST), c.send(False, RESPONSE[0])
    c.fin(False)  # sent, never captured
    packets = c.handshake() + [request, response, c.packet(True, FIN | ACK, ack=len(RESPONSE[0]) + 1)]
    source, conn = one_conn(write_pcap(tmp_path / "lostfin.pcap", packets))
    assert conn.layout(Direction.EGRESS) == [(0, RESPONSE[0], 0)]
    assert source.stats["holes"] == 0
    assert conn.close is not None and conn.close.ts_ns == ts_of(5)  # at the client's FIN, as if both were seen


def test_truncated_packets_report_missing_bytes(tmp_path: Path) -> None:
    c = Conversation()
    body = bytes(range(256)) * 4
    packets = c.handshake() + [c.send(True, REQUEST), c.send(False, body)] + c.closing()
    path = write_pcap(tmp_path / "snap.pcap", packets, frame=lambda p: ethernet(p)[:14 + 40 + 100])
    source, conn = one_conn(path)
    assert conn.layout(Direction.EGRESS) == [(0, body[:100], len(body) - 100)]
    assert source.stats["truncated_packets"] == 1


def test_packets_neither_tcp_nor_udp_are_counted_and_skipped(tmp_path: Path) -> None:
    c = Conversation()
    icmp = bytes(dpkt.ip.IP(src=b"\x01\x02\x03\x04", dst=b"\x01\x02\x03\x05", p=dpkt.ip.IP_PROTO_ICMP,
                            data=dpkt.icmp.ICMP(type=8, data=b"ping")))
    arp = b"\xff" * 6 + b"\x02" * 6 + b"\x08\x06" + b"\x00" * 28
    packets = [ethernet(p) for p in c.handshake() + [icmp, c.send(True, REQUEST)] + c.closing()]
    packets.insert(1, arp)
    source, conn = one_conn(write_pcap(tmp_path / "mixed.pcap", packets, frame=lambda f: f))
    assert conn.stream(Direction.INGRESS) == REQUEST
    assert source.stats["unsupported"] == 2 and source.stats["tcp_segments"] == 6


# --- file formats and link types --------------------------------------------------


def simple_conversation(client=CLIENT, server=SERVER) -> list[bytes]:
    c = Conversation(client, server)
    return c.handshake() + [c.send(True, REQUEST), c.send(False, b"".join(RESPONSE))] + c.closing()


def assert_simple_conversation(path: Path) -> None:
    _, conn = one_conn(path)
    assert conn.stream(Direction.INGRESS) == REQUEST
    assert conn.stream(Direction.EGRESS) == b"".join(RESPONSE)


def vlan(packet: bytes) -> bytes:
    frame = ethernet(packet)
    return frame[:12] + b"\x81\x00\x00\x05" + frame[12:]


def qinq(packet: bytes) -> bytes:
    frame = ethernet(packet)
    return frame[:12] + b"\x88\xa8\x00\x07\x81\x00\x00\x05" + frame[12:]


def af_family(order: str, family: int) -> Callable[[bytes], bytes]:
    return lambda packet: struct.pack(order + "I", family) + packet


@pytest.mark.parametrize(
    ("linktype", "frame"),
    [
        (dpkt.pcap.DLT_EN10MB, vlan),
        (dpkt.pcap.DLT_EN10MB, qinq),
        (dpkt.pcap.DLT_NULL, af_family("<", 2)),
        (dpkt.pcap.DLT_NULL, af_family(">", 2)),
        (108, af_family(">", 2)),  # LINKTYPE_LOOP
        (101, lambda packet: packet),  # LINKTYPE_RAW
        (dpkt.pcap.DLT_IPV4, lambda packet: packet),
        (dpkt.pcap.DLT_LINUX_SLL, lambda p: struct.pack(">HHH8sH", 0, 772, 6, b"\0" * 8, 0x0800) + p),
        (dpkt.pcap.DLT_LINUX_SLL2, lambda p: struct.pack(">HHIHBB8s", 0x0800, 0, 1, 772, 0, 6, b"\0" * 8) + p),
    ],
    ids=["vlan", "qinq", "null-le", "null-be", "loop", "raw", "ipv4", "sll", "sll2"],
)
def test_link_types(tmp_path: Path, linktype: int, frame: Callable[[bytes], bytes]) -> None:
    assert_simple_conversation(write_pcap(tmp_path / "link.pcap", simple_conversation(), linktype, frame))


def test_ipv6_raw_with_extension_header_and_truncation(tmp_path: Path) -> None:
    client, server = ("fd00::1", 40000), ("fd00::2", 8080)
    packets = simple_conversation(client, server)

    def with_hop_by_hop(packet: bytes) -> bytes:  # next header 0, 8 bytes of padding options
        payload_length = struct.unpack(">H", packet[4:6])[0] + 8
        header = packet[:4] + struct.pack(">HBB", payload_length, 0, packet[7]) + packet[8:40]
        return header + bytes([packet[6], 0, 1, 4, 0, 0, 0, 0]) + packet[40:]

    assert_simple_conversation(write_pcap(tmp_path / "v6.pcap", packets, dpkt.pcap.DLT_IPV6, with_hop_by_hop))
    cut = write_pcap(tmp_path / "v6cut.pcap", packets, 101, lambda p: with_hop_by_hop(p)[:40 + 8 + 20 + 5])
    _, conn = one_conn(cut)
    assert conn.layout(Direction.EGRESS) == [(0, b"".join(RESPONSE)[:5], sum(map(len, RESPONSE)) - 5)]


def test_nanosecond_pcap_keeps_nanoseconds(tmp_path: Path) -> None:
    path = tmp_path / "nano.pcap"
    with path.open("wb") as f:
        writer = dpkt.pcap.Writer(f, nano=True)
        for i, packet in enumerate(simple_conversation()):
            writer.writepkt(ethernet(packet), ts=Decimal(T0) + Decimal(i * 1001 + 7) / 10**9)
    events = list(PcapSource(path).events())
    assert events[0].ts_ns == T0 * 10**9 + 7
    assert events[-1].ts_ns == T0 * 10**9 + 6 * 1001 + 7


def test_big_endian_pcap(tmp_path: Path) -> None:
    path = tmp_path / "be.pcap"
    records = [struct.pack(">IIII", T0, i, len(f), len(f)) + f for i, f in enumerate(map(ethernet, simple_conversation()))]
    path.write_bytes(struct.pack(">IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1) + b"".join(records))
    assert_simple_conversation(path)


def write_pcapng(path: Path, interfaces: list[tuple[int, bytes]], packets: list[tuple[int, int, bytes]]) -> Path:
    """``interfaces``: (link type, if_tsresol byte); ``packets``: (interface, timestamp in its units, frame)."""
    opt = dpkt.pcapng.PcapngOptionLE
    idbs = [
        dpkt.pcapng.InterfaceDescriptionBlockLE(linktype=linktype, snaplen=65535, opts=[
            opt(code=dpkt.pcapng.PCAPNG_OPT_IF_TSRESOL, data=resolution), opt(code=dpkt.pcapng.PCAPNG_OPT_ENDOFOPT)])
        for linktype, resolution in interfaces
    ]
    with path.open("wb") as f:
        writer = dpkt.pcapng.Writer(f, idb=idbs)
        for interface, ts, frame in packets:
            writer.writepkt(dpkt.pcapng.EnhancedPacketBlockLE(
                iface_id=interface, ts_high=ts >> 32, ts_low=ts & 0xFFFFFFFF, caplen=len(frame), pkt_len=len(frame),
                pkt_data=frame))
    return path


def test_pcapng_with_two_interfaces_and_their_own_clocks(tmp_path: Path) -> None:
    """Packet i at T0 + i/512 s: on interface 0 (Ethernet) in nanoseconds,
    on interface 1 (raw IP) in 1/1024 s units."""
    frames = [
        (0, T0 * 10**9 + i * 1_953_125, ethernet(p)) if i % 2 == 0 else (1, T0 * 1024 + 2 * i, p)
        for i, p in enumerate(simple_conversation())
    ]
    path = write_pcapng(tmp_path / "two.pcapng", [(dpkt.pcap.DLT_EN10MB, b"\x09"), (101, b"\x8a")], frames)
    assert_simple_conversation(path)
    events = list(PcapSource(path).events())
    assert events[0].ts_ns == T0 * 10**9
    assert events[-1].ts_ns == T0 * 10**9 + 6 * 1_953_125


def test_pcapng_of_a_recorded_capture_matches_the_pcap(tmp_path: Path) -> None:
    with (DATA / "http_keepalive.pcap").open("rb") as f:
        records = [(int(round(ts * 1e6)), frame) for ts, frame in dpkt.pcap.Reader(f)]
    path = write_pcapng(tmp_path / "keepalive.pcapng", [(dpkt.pcap.DLT_EN10MB, b"\x06")],
                        [(0, ts, frame) for ts, frame in records])
    assert list(PcapSource(path).events()) == list(PcapSource(DATA / "http_keepalive.pcap").events())


# --- bad and truncated files --------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not a pcap or pcapng capture"),
        (b"GET / HTTP/1.1\r\n\r\n", "not a pcap or pcapng capture (starts with 47455420)"),
        (struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 147), "link type 147 is not supported"),
        (struct.pack("<IHH", 0xA1B2C3D4, 2, 4), "pcap file header cut short"),
        (b"\n\r\r\n" + struct.pack("<II", 28, 0x12345678) + b"\0" * 16, "byte-order magic"),
        (b"\n\r\r\n" + struct.pack("<II", 27, 0x1A2B3C4D) + b"\0" * 20, "corrupt pcapng block at byte 0: length 27"),
    ],
    ids=["empty", "text", "link-type", "short-header", "pcapng-bom", "pcapng-length"],
)
def test_bad_files_fail_at_open_with_a_clear_message(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.pcap"
    path.write_bytes(content)
    with pytest.raises(PcapError, match=message.replace("(", r"\(").replace(")", r"\)")) as raised:
        PcapSource(path)
    assert str(path) in str(raised.value)


def test_pcapng_with_unsupported_link_type_fails_at_open(tmp_path: Path) -> None:
    path = write_pcapng(tmp_path / "usb.pcapng", [(dpkt.pcap.DLT_USB_LINUX, b"\x06")], [])
    with pytest.raises(PcapError, match="link type 189 is not supported"):
        PcapSource(path)


def test_corrupt_record_midway_names_its_offset(tmp_path: Path) -> None:
    path = write_pcap(tmp_path / "corrupt.pcap", simple_conversation())
    content = bytearray(path.read_bytes())
    first_record = 24 + 16 + struct.unpack_from("<I", content, 24 + 8)[0]
    struct.pack_into("<I", content, first_record + 8, 10**7)
    path.write_bytes(bytes(content))
    source = PcapSource(path)  # the header is fine
    with pytest.raises(PcapError, match=f"corrupt record at byte {first_record}: captured length 10000000"):
        list(source.events())


@pytest.mark.parametrize("cut", [1, 10, 66, 70], ids=["data", "more-data", "all-data", "header"])
def test_truncated_file_stops_cleanly(tmp_path: Path, cut: int) -> None:
    whole = (DATA / "nginx_large.pcap").read_bytes()
    path = tmp_path / "cut.pcap"
    path.write_bytes(whole[:-cut])
    source, conns = replay(path)
    [conn] = conns.values()
    assert source.stats["incomplete_records"] == 1
    assert source.stats["packets"] == 16  # all but the cut last one
    assert conn.close is not None  # still closed, at the last good packet


def test_truncated_pcapng_stops_cleanly(tmp_path: Path) -> None:
    path = write_pcapng(tmp_path / "t.pcapng", [(101, b"\x06")],
                        [(0, T0 * 10**6 + i, p) for i, p in enumerate(simple_conversation())])
    path.write_bytes(path.read_bytes()[:-30])
    source, conns = replay(path)
    assert source.stats["incomplete_records"] == 1 and source.stats["packets"] == 6
    [conn] = conns.values()
    assert conn.stream(Direction.EGRESS) == b"".join(RESPONSE)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="perspective"):
        PcapSource(DATA / "http_get.pcap", "middle")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="capture_bytes"):
        PcapSource(DATA / "http_get.pcap", capture_bytes=0)


# --- UDP ----------------------------------------------------------------------------


def udp_packet(src: tuple[str, int], dst: tuple[str, int], payload: bytes) -> bytes:
    udp = dpkt.udp.UDP(sport=src[1], dport=dst[1], data=payload)
    udp.ulen = len(bytes(udp))
    if ":" in src[0]:
        return bytes(dpkt.ip6.IP6(
            src=socket.inet_pton(socket.AF_INET6, src[0]), dst=socket.inet_pton(socket.AF_INET6, dst[0]),
            nxt=dpkt.ip.IP_PROTO_UDP, hlim=64, plen=len(bytes(udp)), data=udp))
    return bytes(dpkt.ip.IP(src=socket.inet_aton(src[0]), dst=socket.inet_aton(dst[0]), p=dpkt.ip.IP_PROTO_UDP, data=udp))


def ipv4_fragments(packet: bytes, size: int) -> list[bytes]:
    """``packet`` (IPv4, 20-byte header) cut into fragments of ``size`` payload bytes (a multiple of 8)."""
    header, payload = packet[:20], packet[20:]
    out = []
    for offset in range(0, len(payload), size):
        piece = payload[offset : offset + size]
        more = 0x2000 if offset + size < len(payload) else 0
        fragment = bytearray(header + piece)
        struct.pack_into(">HHH", fragment, 2, 20 + len(piece), 4242, more | offset // 8)
        struct.pack_into(">H", fragment, 10, 0)
        out.append(bytes(fragment))
    return out


def datagram_view(conns: dict[int, Conn]) -> list[tuple]:
    """Per UDP socket: (pid, local port, [(direction, data, total, peer)...])."""
    return [
        (c.open.pid, c.open.local_port,
         [(d.direction.name, d.data, d.total_len, (d.peer_addr, d.peer_port)) for d in c.datagrams])
        for c in conns.values() if c.datagrams
    ]


def test_udp_echo_recorded_server_side() -> None:
    source, conns = replay(DATA / "udp_echo.pcap")
    [sock] = conns.values()
    assert source.endpoints == {1: Endpoint(1, "server", "127.0.0.1", 18090, "127.0.0.1:18090")}
    assert (sock.open.family, sock.open.local_addr, sock.open.local_port) == (socket.AF_INET, "127.0.0.1", 18090)
    assert (sock.open.peer_addr, sock.open.peer_port, sock.open.role_hint) == ("", 0, RoleHint.UNKNOWN)
    assert not sock.data and sock.close is not None
    sent = [b"ping 1", b"ping 2", b"x" * 3000]
    received = [(d.direction, d.data) for d in sock.datagrams]
    assert received == [pair for m in sent for pair in ((Direction.INGRESS, m), (Direction.EGRESS, b"echo: " + m))]
    client_port = sock.datagrams[0].peer_port
    assert {(d.peer_addr, d.peer_port) for d in sock.datagrams} == {("127.0.0.1", client_port)} and client_port != 18090
    assert source.stats["udp_datagrams"] == 6 and source.stats["udp_sockets"] == 1
    assert source.stats["tcp_segments"] == source.stats["connections"] == 0


def test_udp_echo_client_side_and_both() -> None:
    source, conns = replay(DATA / "udp_echo.pcap", "client")
    [sock] = conns.values()
    assert source.endpoints[1].role == "client"
    assert [d.direction for d in sock.datagrams][:2] == [Direction.EGRESS, Direction.INGRESS]
    assert {d.peer_port for d in sock.datagrams} == {18090}
    events = list(PcapSource(DATA / "udp_echo.pcap", "both").events())
    grams = [e for e in events if isinstance(e, DatagramEvent)]
    assert len(grams) == 12
    for send, receive in zip(grams[::2], grams[1::2]):  # each datagram: the sender's EGRESS, then the receiver's INGRESS
        assert (send.direction, receive.direction) == (Direction.EGRESS, Direction.INGRESS)
        assert (send.data, send.ts_ns) == (receive.data, receive.ts_ns) and send.pid != receive.pid
    assert isinstance(events[0], ConnOpen) and isinstance(events[1], ConnOpen)
    assert [type(e) for e in events[-2:]] == [ConnClose, ConnClose]


def test_udp_server_side_heuristics(tmp_path: Path) -> None:
    """First receiver; a privileged port even when its answer comes first;
    an endpoint already serving another peer."""
    resolver, app, other = ("10.0.0.53", 53), ("10.0.0.1", 40000), ("10.0.0.2", 40001)
    game, player = ("10.0.0.9", 27015), ("10.0.0.7", 50000)
    packets = [
        udp_packet(resolver, app, b"answer seen first"),  # the query was before the capture
        udp_packet(player, game, b"hello"),  # first receiver: the game server (despite the port)
        udp_packet(game, player, b"welcome"),
        udp_packet(game, other, b"state"),  # game already serves: it is the server here too
    ]
    source, conns = replay(write_pcap(tmp_path / "udp.pcap", packets))
    servers = {e.service_name for e in source.endpoints.values()}
    assert servers == {"10.0.0.53:53", "10.0.0.9:27015"}
    view = {port: grams for _, port, grams in datagram_view(conns)}
    assert view[53] == [("EGRESS", b"answer seen first", 17, ("10.0.0.1", 40000))]
    assert [g[:2] for g in view[27015]] == [("INGRESS", b"hello"), ("EGRESS", b"welcome"), ("EGRESS", b"state")]


def test_udp_multicast_is_replayed_from_the_sender_only(tmp_path: Path) -> None:
    host = ("10.0.0.5", 5353)
    packets = [udp_packet(host, ("224.0.0.251", 5353), b"mdns query"), udp_packet(("fe80::1", 5353), ("ff02::fb", 5353), b"v6")]
    for perspective in ("server", "client", "both"):
        source, conns = replay(write_pcap(tmp_path / "mc.pcap", packets), perspective)
        view = datagram_view(conns)
        assert [grams for _, _, grams in view] == [[("EGRESS", b"mdns query", 10, ("224.0.0.251", 5353))],
                                                  [("EGRESS", b"v6", 2, ("ff02::fb", 5353))]]
        assert source.stats["multicast_datagrams"] == 2
        assert [e.role for e in source.endpoints.values()] == ["client", "client"]


def test_udp_ipv6_and_snap_length(tmp_path: Path) -> None:
    client, server = ("fd00::1", 40000), ("fd00::2", 8125)
    payload = bytes(range(200))
    path = write_pcap(tmp_path / "v6.pcap", [udp_packet(client, server, payload)], 101, lambda p: p[:40 + 8 + 50])
    source, conns = replay(path)
    [sock] = conns.values()
    assert (sock.open.family, sock.open.local_addr) == (socket.AF_INET6, "fd00::2")
    [gram] = sock.datagrams
    assert (gram.data, gram.total_len, gram.missing) == (payload[:50], 200, 150)
    assert gram.peer_addr == "fd00::1" and gram.family == socket.AF_INET6
    assert source.stats["truncated_packets"] == 1 and source.stats["missing_bytes"] == 150


def test_ipv4_fragments_are_reassembled(tmp_path: Path) -> None:
    payload = bytes(range(256)) * 12  # 3072 bytes
    packet = udp_packet(CLIENT, ("10.0.0.2", 4789), payload)
    fragments = ipv4_fragments(packet, 1024)
    assert len(fragments) == 4
    shuffled = [fragments[2], fragments[0], fragments[3], fragments[1]]
    lost = ipv4_fragments(udp_packet(CLIENT, ("10.0.0.2", 4789), b"y" * 2000), 1024)[:1]  # the rest never came
    source, conns = replay(write_pcap(tmp_path / "frag.pcap", shuffled + lost))
    [sock] = conns.values()
    [gram] = sock.datagrams
    assert (gram.data, gram.total_len, gram.ts_ns) == (payload, len(payload), ts_of(3))  # when the last one arrived
    stats = source.stats
    assert (stats["ip_fragments"], stats["fragments_reassembled"], stats["fragments_dropped"]) == (5, 1, 1)
    assert stats["udp_datagrams"] == 1


def test_tcp_and_udp_interleaved_stay_in_time_order(tmp_path: Path) -> None:
    c = Conversation()
    dns = [udp_packet(("10.0.0.1", 45000), ("10.0.0.53", 53), b"q"), udp_packet(("10.0.0.53", 53), ("10.0.0.1", 45000), b"a")]
    packets = c.handshake() + [c.send(True, REQUEST), dns[0], c.send(False, RESPONSE[0]), dns[1], c.send(False, RESPONSE[1])]
    packets += c.closing()
    path = write_pcap(tmp_path / "mixed.pcap", packets)
    for capture_bytes in (None, 1000):
        _, conns = replay(path, "both", capture_bytes)  # connections() checks the time order
        tcp = [conn for conn in conns.values() if conn.data]
        assert len(tcp) == 2 and len([conn for conn in conns.values() if conn.datagrams]) == 2
        server = next(conn for conn in tcp if conn.open.role_hint == RoleHint.ACCEPTED)
        assert server.stream(Direction.EGRESS) == RESPONSE[0] + RESPONSE[1]


# --- properties ---------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(frames=st.lists(st.binary(max_size=120), max_size=20), linktype=st.sampled_from(sorted(link.LINK_DECODERS)))
def test_garbage_frames_never_raise(frames: list[bytes], linktype: int) -> None:
    stats = pcap_replay.new_stats()
    fragments = Ipv4Fragments(stats)
    for i, frame in enumerate(frames):
        link.decode_packet(linktype, frame, i, stats, fragments)
    fragments.finish()
    outcomes = ("unsupported", "malformed", "tcp_segments", "udp_datagrams", "ip_fragments")
    assert sum(stats[k] for k in outcomes) == len(frames) + stats["fragments_reassembled"]


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_arrival_order_rebuilds_the_stream(data: st.DataObject) -> None:
    """Shuffled, duplicated, re-cut and partly lost segments: the captured
    bytes sit at their true offsets and missing bytes fill exactly the rest."""
    stream = bytes(range(256)) * 2
    cuts = sorted(data.draw(st.sets(st.integers(1, len(stream) - 1), max_size=12)))
    segments = list(zip([0] + cuts, cuts + [len(stream)]))
    arrivals = data.draw(st.lists(st.sampled_from(segments), max_size=30))
    recut = st.tuples(st.integers(0, len(stream) - 1), st.integers(1, 60))
    arrivals += [(start, min(start + size, len(stream))) for start, size in data.draw(st.lists(recut, max_size=5))]
    arrivals = data.draw(st.permutations(arrivals))
    isn = 2**32 - 100  # wraps midway
    out: list[streams.Piece] = []
    stats = pcap_replay.new_stats()
    receiver = streams.Stream(stats)
    receiver.start(isn)
    for start, end in arrivals:
        receiver.segment(0, isn + start, stream[start:end], end - start, False, out)
    receiver.acknowledge(0, isn + len(stream), out)
    offset = 0
    for _, captured, missing in out:
        assert captured == stream[offset : offset + len(captured)]
        offset += len(captured) + missing
    covered = {i for start, end in arrivals for i in range(start, end)}
    if covered == set(range(len(stream) - 1)):
        # Only the last byte lost: an acknowledgement one past everything seen is
        # taken for a lost FIN's (Stream.acknowledge), so no byte is reported missing.
        assert offset == len(stream) - 1 and stats["holes"] == 0
        return
    assert offset == len(stream)
    assert (stats["holes"] == 0) == (len(covered) == len(stream))
