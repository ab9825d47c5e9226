"""Replay a packet capture as if each TCP endpoint in it were a traced process.

A capture (pcap or pcapng, as tcpdump or Wireshark write them) holds what went
over the wire; the agent's pipeline wants what processes read and wrote. This
source bridges the two so the same pipeline can be run, debugged and tested
on recorded traffic without eBPF:

* each server endpoint (ip, port) and each client ip becomes a synthetic
  process with a small pid (see :class:`Endpoint`);
* each TCP connection becomes, per traced side, a :class:`ConnOpen`, the
  byte stream that side read (INGRESS) and wrote (EGRESS) as
  :class:`DataEvent` s, and a :class:`ConnClose`;
* the byte streams are rebuilt from segments the way the receiving kernel
  would: in sequence order, without retransmitted bytes, with bytes that
  passed but are not in the capture (lost from it, or cut by the snap
  length) reported as ``missing`` so parsers stay in step.

Which side is the server: the one that received the SYN (or sent the
SYN-ACK). For a connection already open when the capture began, it is a
guess, in this order: the endpoint more earlier connections in the capture
already used (clients take a fresh port per connection, servers keep
theirs); then the lower port (servers listen on well-known or registered
ports, below the ephemeral range clients draw from); then the destination of
the first packet seen. Such connections get ``RoleHint.UNKNOWN``, as the
eBPF source gives to connections that predate the agent, and only start at a
packet that carries data: a stray ACK, FIN or RST of a connection never seen
opening says nothing worth tracing.

dpkt reads the file headers and decodes IP and TCP. Two hot or lossy steps
are done here instead: walking the packet records (dpkt's readers turn
timestamps into floats, losing nanoseconds, and cannot tell a record cut
short by the end of the file), and skipping the link-layer header (dpkt's
link decoders decode every layer eagerly, which alone would cost more than
the whole per-packet budget).
"""

from __future__ import annotations

import heapq
import socket
import struct
from collections import deque
from dataclasses import dataclass, field
from os import PathLike
from typing import BinaryIO, Callable, Iterator, Literal

import dpkt

from otelbpf.events import ConnClose, ConnOpen, DataEvent, Event, RoleHint
from protocols.base import Direction

Perspective = Literal["server", "client", "both"]
Role = Literal["server", "client"]

#: Bytes a direction may hold out of order, waiting for a hole to fill,
#: before the hole is given up on and reported as missing.
MAX_OUT_OF_ORDER_BYTES = 4 * 1024 * 1024


class PcapError(Exception):
    """The file cannot be replayed: not a capture, corrupt, or of a link type
    this source does not decode. The message names the file and the reason."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """The synthetic process standing for one side of the captured traffic."""

    pid: int
    role: Role
    ip: str
    #: The listening port for a server; None for a client (one process per
    #: client ip, whatever ephemeral ports it used).
    port: int | None
    #: Readable name for the Resource, e.g. "10.0.0.2:8080", "client 10.0.0.1".
    service_name: str


def _new_stats() -> dict[str, int]:
    """The counters a replay keeps, all zero (see :attr:`PcapSource.stats`)."""
    return dict.fromkeys(
        (
            "packets",  # records read from the file
            "tcp_segments",  # of which TCP over IPv4/IPv6
            "non_tcp",  # not IP, not TCP, IP fragments, or an unknown link type
            "malformed",  # IP or TCP header that does not decode
            "truncated_packets",  # captured fewer payload bytes than IP says (snap length)
            "incomplete_records",  # 1 if the file ends inside a record (cut short)
            "connections",  # TCP connections replayed
            "retransmits",  # segments that repeated bytes already seen
            "out_of_order",  # segments that arrived ahead of a hole
            "holes",  # gaps given up on and reported as missing
            "missing_bytes",  # bytes reported as missing: holes and snap length cuts
        ),
        0,
    )


# --- reading capture files ----------------------------------------------------

#: One captured packet: (unix-epoch ns, link type, the bytes captured).
_Frame = tuple[int, int, bytes]

_PCAP_MAGICS = frozenset(dpkt.pcap.MAGIC_TO_PKT_HDR)
_PCAP_NANO_MAGICS = frozenset((dpkt.pcap.TCPDUMP_MAGIC_NANO, dpkt.pcap.PMUDPCT_MAGIC_NANO))
_PCAP_LE_MAGICS = frozenset((dpkt.pcap.PMUDPCT_MAGIC, dpkt.pcap.PMUDPCT_MAGIC_NANO, dpkt.pcap.PACPDOM_MAGIC))
_PCAPNG_SHB_BYTES = struct.pack(">I", dpkt.pcapng.PCAPNG_BT_SHB)
#: libpcap's own sanity bound on a record's captured length.
_MAX_SNAPLEN = 262144
_MAX_PCAPNG_BLOCK = 16 * 1024 * 1024


class _CaptureReader:
    """An open capture file; subclasses walk its packet records."""

    def __init__(self, file: BinaryIO, path: str, stats: dict[str, int]) -> None:
        self._file = file
        self._path = path
        self._stats = stats

    def frames(self) -> Iterator[_Frame]:
        raise NotImplementedError

    def close(self) -> None:
        self._file.close()

    def _cut_short(self) -> None:
        """The file ends inside a record: a capture still being written, or
        copied while it was. Everything before it is good; stop there."""
        self._stats["incomplete_records"] = 1


class _PcapReader(_CaptureReader):
    """Classic libpcap format: one link type, fixed-size record headers."""

    def __init__(self, file: BinaryIO, path: str, stats: dict[str, int]) -> None:
        super().__init__(file, path, stats)
        raw = file.read(dpkt.pcap.FileHdr.__hdr_len__)
        if len(raw) < dpkt.pcap.FileHdr.__hdr_len__:
            raise PcapError(f"{path}: pcap file header cut short ({len(raw)} bytes)")
        magic = dpkt.pcap.FileHdr(raw).magic
        header = dpkt.pcap.LEFileHdr(raw) if magic in _PCAP_LE_MAGICS else dpkt.pcap.FileHdr(raw)
        record_header = dpkt.pcap.MAGIC_TO_PKT_HDR[magic]
        self._record_size = record_header.__hdr_len__
        # Only the first three fields are needed: seconds, fraction, captured length.
        self._record = struct.Struct(record_header.__hdr_fmt__[0] + "III")
        self._fraction_ns = 1 if magic in _PCAP_NANO_MAGICS else 1000
        self._max_caplen = max(header.snaplen, _MAX_SNAPLEN)
        self.link_type = header.linktype
        _require_supported(path, [self.link_type])

    def frames(self) -> Iterator[_Frame]:
        read, unpack, size = self._file.read, self._record.unpack_from, self._record_size
        fraction_ns, max_caplen, link_type = self._fraction_ns, self._max_caplen, self.link_type
        while True:
            header = read(size)
            if len(header) < size:
                if header:
                    self._cut_short()
                return
            seconds, fraction, caplen = unpack(header)
            if caplen > max_caplen:
                offset = self._file.tell() - size
                raise PcapError(
                    f"{self._path}: corrupt record at byte {offset}: captured length {caplen} "
                    f"exceeds the snap length {max_caplen}"
                )
            frame = read(caplen)
            if len(frame) < caplen:
                self._cut_short()
                return
            yield seconds * 1_000_000_000 + fraction * fraction_ns, link_type, frame


@dataclass(slots=True)
class _Interface:
    """What a pcapng Interface Description Block says about its packets."""

    link_type: int
    #: Timestamp units per second (if_tsresol; microseconds by default).
    units_per_second: int = 1_000_000
    offset_ns: int = 0  # if_tsoffset


class _PcapngReader(_CaptureReader):
    """pcapng: sections of blocks, each section with its own byte order and
    interfaces (and so link types and timestamp units). Packets are read from
    Enhanced Packet Blocks; other blocks (statistics, name resolution, the
    rare Simple and obsolete Packet Blocks) are skipped."""

    def __init__(self, file: BinaryIO, path: str, stats: dict[str, int]) -> None:
        super().__init__(file, path, stats)
        self._interfaces: list[_Interface] = []
        self._order = "<"
        self._check_leading_interfaces()

    def _check_leading_interfaces(self) -> None:
        """Fail now, not midway, if no interface described before the first
        packet has a link type we decode; then rewind for :meth:`frames`."""
        for block_type, head, body in self._blocks():
            if block_type == dpkt.pcapng.PCAPNG_BT_EPB:
                if not self._interfaces:
                    raise PcapError(f"{self._path}: corrupt pcapng: a packet before any interface description")
                break
            self._read_description(block_type, head + body)
        if self._interfaces:
            _require_supported(self._path, [i.link_type for i in self._interfaces])
        self._file.seek(0)
        self._interfaces.clear()

    def frames(self) -> Iterator[_Frame]:
        interfaces = self._interfaces  # cleared, not replaced, by a new section
        epb_fields = struct.Struct(self._order + "IIII")
        for block_type, head, body in self._blocks():
            if block_type != dpkt.pcapng.PCAPNG_BT_EPB:
                if self._read_description(block_type, head + body):
                    epb_fields = struct.Struct(self._order + "IIII")
                continue
            # Enhanced Packet Block body: interface, timestamp (high, low),
            # captured length, original length, data, options, block length.
            interface_id, ts_high, ts_low, caplen = epb_fields.unpack_from(body)
            if interface_id >= len(interfaces) or 20 + caplen > len(body) - 4:
                raise PcapError(
                    f"{self._path}: corrupt packet block (interface {interface_id} of "
                    f"{len(interfaces)}, captured length {caplen}, block length {8 + len(body)})"
                )
            interface = interfaces[interface_id]
            ts_ns = ((ts_high << 32) | ts_low) * 1_000_000_000 // interface.units_per_second + interface.offset_ns
            yield ts_ns, interface.link_type, body[20 : 20 + caplen]

    def _read_description(self, block_type: int, block: bytes) -> bool:
        """Take in a section or interface description block; True if it
        began a new section (byte order may have changed)."""
        try:
            if block_type == dpkt.pcapng.PCAPNG_BT_SHB:
                self._start_section(block)
                return True
            if block_type == dpkt.pcapng.PCAPNG_BT_IDB:
                self._interfaces.append(self._describe_interface(block))
        except (dpkt.UnpackError, struct.error, ValueError) as error:
            raise PcapError(f"{self._path}: corrupt pcapng block of type {block_type:#x}: {error}") from None
        return False

    def _start_section(self, block: bytes) -> None:
        big_endian = self._order == ">"
        shb = dpkt.pcapng.SectionHeaderBlock(block) if big_endian else dpkt.pcapng.SectionHeaderBlockLE(block)
        if shb.v_major != dpkt.pcapng.PCAPNG_VERSION_MAJOR:
            raise PcapError(f"{self._path}: pcapng version {shb.v_major}.{shb.v_minor} is not supported")
        self._interfaces.clear()

    def _describe_interface(self, block: bytes) -> _Interface:
        big_endian = self._order == ">"
        idb = dpkt.pcapng.InterfaceDescriptionBlock(block) if big_endian else dpkt.pcapng.InterfaceDescriptionBlockLE(block)
        interface = _Interface(idb.linktype)
        for option in idb.opts:
            if option.code == dpkt.pcapng.PCAPNG_OPT_IF_TSRESOL and option.data:
                exponent = option.data[0]
                base = 2 if exponent & 0x80 else 10
                interface.units_per_second = base ** (exponent & 0x7F)
            elif option.code == dpkt.pcapng.PCAPNG_OPT_IF_TSOFFSET and len(option.data) == 8:
                interface.offset_ns = struct.unpack(self._order + "q", option.data)[0] * 1_000_000_000
        return interface

    def _blocks(self) -> Iterator[tuple[int, bytes, bytes]]:
        """(type, head, body) of each block in file order: the head is the
        type and length (and, for a section header, the byte-order magic),
        the body the rest. A section header sets the byte order that its own
        length and the blocks after it are written in."""
        read = self._file.read
        head_fields = struct.Struct(self._order + "II")
        while True:
            head = read(8)
            if len(head) < 8:
                if head:
                    self._cut_short()
                return
            block_type, length = head_fields.unpack(head)
            if block_type == dpkt.pcapng.PCAPNG_BT_SHB:  # same bytes in either order
                byte_order_magic = read(4)
                if len(byte_order_magic) < 4:
                    self._cut_short()
                    return
                self._order = _section_byte_order(self._path, byte_order_magic)
                head_fields = struct.Struct(self._order + "II")
                length = head_fields.unpack(head)[1]
                head += byte_order_magic
            if length < 12 or length % 4 or length > _MAX_PCAPNG_BLOCK:
                offset = self._file.tell() - len(head)
                raise PcapError(f"{self._path}: corrupt pcapng block at byte {offset}: length {length}")
            body = read(length - len(head))
            if len(body) < length - len(head):
                self._cut_short()
                return
            yield block_type, head, body


def _section_byte_order(path: str, byte_order_magic: bytes) -> str:
    if byte_order_magic == struct.pack(">I", dpkt.pcapng.BYTE_ORDER_MAGIC):
        return ">"
    if byte_order_magic == struct.pack("<I", dpkt.pcapng.BYTE_ORDER_MAGIC):
        return "<"
    raise PcapError(f"{path}: corrupt pcapng section header: byte-order magic {byte_order_magic.hex()}")


def _open_capture(path: str | PathLike[str], stats: dict[str, int]) -> _CaptureReader:
    """Open a pcap or pcapng file (told apart by content, not name) and check
    that its header is sound and its link type is one we decode."""
    name = str(path)
    file = open(name, "rb")
    try:
        magic = file.read(4)
        file.seek(0)
        if magic == _PCAPNG_SHB_BYTES:
            return _PcapngReader(file, name, stats)
        if len(magic) == 4 and struct.unpack(">I", magic)[0] in _PCAP_MAGICS:
            return _PcapReader(file, name, stats)
        raise PcapError(f"{name}: not a pcap or pcapng capture (starts with {magic.hex() or 'nothing'})")
    except BaseException:
        file.close()
        raise


# --- link layer -----------------------------------------------------------------

_ETHERTYPE_IPV4 = 0x0800
_ETHERTYPE_IPV6 = 0x86DD
_ETHERTYPES_VLAN = frozenset((0x8100, 0x88A8, 0x9100))
_IP_ETHERTYPES = frozenset((_ETHERTYPE_IPV4, _ETHERTYPE_IPV6))


def _ip_after_ethernet(frame: bytes) -> int:
    """Offset of the IP header in an Ethernet frame (VLAN tags skipped), or -1."""
    offset = 14
    ethertype = int.from_bytes(frame[12:14], "big")
    while ethertype in _ETHERTYPES_VLAN:
        ethertype = int.from_bytes(frame[offset + 2 : offset + 4], "big")
        offset += 4
    return offset if ethertype in _IP_ETHERTYPES else -1


def _ip_after_sll(frame: bytes) -> int:
    """Linux cooked capture v1 (tcpdump -i any): protocol at bytes 14-15."""
    return 16 if int.from_bytes(frame[14:16], "big") in _IP_ETHERTYPES else -1


def _ip_after_sll2(frame: bytes) -> int:
    """Linux cooked capture v2: protocol at bytes 0-1, 20-byte header."""
    return 20 if int.from_bytes(frame[0:2], "big") in _IP_ETHERTYPES else -1


def _ip_after_loopback(frame: bytes) -> int:
    """BSD loopback (DLT_NULL, DLT_LOOP): a 4-byte address family, in the
    writer's byte order for NULL and with OS-specific values for IPv6, so
    the IP version nibble after it is what tells IPv4 from IPv6."""
    return 4


def _ip_at_start(frame: bytes) -> int:
    return 0


#: Link type -> where the IP header starts in a frame of that type.
_LINK_DECODERS: dict[int, Callable[[bytes], int]] = {
    dpkt.pcap.DLT_EN10MB: _ip_after_ethernet,
    dpkt.pcap.DLT_LINUX_SLL: _ip_after_sll,
    dpkt.pcap.DLT_LINUX_SLL2: _ip_after_sll2,
    dpkt.pcap.DLT_NULL: _ip_after_loopback,
    108: _ip_after_loopback,  # LINKTYPE_LOOP (dpkt's DLT_LOOP is 12 on OpenBSD)
    101: _ip_at_start,  # LINKTYPE_RAW
    dpkt.pcap.DLT_IPV4: _ip_at_start,
    dpkt.pcap.DLT_IPV6: _ip_at_start,
}


def _require_supported(path: str, link_types: list[int]) -> None:
    if not any(t in _LINK_DECODERS for t in link_types):
        names = ", ".join(str(t) for t in link_types)
        raise PcapError(
            f"{path}: link type {names} is not supported (supported: Ethernet, Linux cooked SLL/SLL2, "
            "raw IP, BSD loopback)"
        )


# --- IP and TCP -----------------------------------------------------------------

#: A decoded TCP segment: (src ip bytes, src port, dst ip bytes, dst port, seq,
#: ack, flags, captured payload, payload bytes on the wire but not captured).
_Segment = tuple[bytes, int, bytes, int, int, int, int, bytes, int]

_TH_FIN, _TH_SYN, _TH_RST, _TH_ACK = dpkt.tcp.TH_FIN, dpkt.tcp.TH_SYN, dpkt.tcp.TH_RST, dpkt.tcp.TH_ACK
_IP_FRAGMENT_BITS = 0x3FFF  # more-fragments flag and fragment offset
_IP_PROTO_TCP = dpkt.ip.IP_PROTO_TCP


def _decode_segment(link_type: int, frame: bytes, stats: dict[str, int]) -> _Segment | None:
    """The TCP segment in ``frame``, or None (counted in ``stats`` by reason)."""
    locate_ip = _LINK_DECODERS.get(link_type)
    offset = locate_ip(frame) if locate_ip is not None else -1
    version = frame[offset] >> 4 if 0 <= offset < len(frame) else 0
    try:
        if version == 4:
            return _decode_ipv4(frame[offset:], stats)
        if version == 6:
            return _decode_ipv6(frame[offset:], stats)
    except (dpkt.UnpackError, struct.error):
        stats["malformed"] += 1
        return None
    stats["non_tcp"] += 1
    return None


def _decode_ipv4(packet: bytes, stats: dict[str, int]) -> _Segment | None:
    ip = dpkt.ip.IP(packet)
    if ip.p != _IP_PROTO_TCP or ip._flags_offset & _IP_FRAGMENT_BITS:
        stats["non_tcp"] += 1
        return None
    # ip.len is 0 in packets captured before TCP segmentation offload split them.
    wire_length = ip.len - (ip.hl << 2) if ip.len else None
    return _segment(ip.src, ip.dst, ip.data, wire_length, stats)


def _decode_ipv6(packet: bytes, stats: dict[str, int]) -> _Segment | None:
    ip = dpkt.ip6.IP6(packet)
    if ip.p != _IP_PROTO_TCP or dpkt.ip.IP_PROTO_FRAGMENT in ip.extension_hdrs:
        stats["non_tcp"] += 1
        return None
    extensions = sum(header.length for header in ip.all_extension_headers)
    wire_length = ip.plen - extensions if ip.plen else None
    return _segment(ip.src, ip.dst, ip.data, wire_length, stats)


def _segment(src: bytes, dst: bytes, tcp: object, wire_length: int | None, stats: dict[str, int]) -> _Segment | None:
    """``wire_length``: TCP header and payload bytes as the IP header counts them."""
    if not isinstance(tcp, dpkt.tcp.TCP):  # header cut short or nonsense
        stats["malformed"] += 1
        return None
    stats["tcp_segments"] += 1
    payload = tcp.data
    missing = 0
    if wire_length is not None:
        missing = wire_length - (tcp.off << 2) - len(payload)
        if missing > 0:
            stats["truncated_packets"] += 1
        else:
            missing = 0
    return src, tcp.sport, dst, tcp.dport, tcp.seq, tcp.ack, tcp.flags, payload, missing


# --- reassembly -----------------------------------------------------------------

#: Stream bytes ready for a reader: (ns, captured bytes, bytes missing after them).
_Piece = tuple[int, bytes, int]

_SEQ_MASK = 0xFFFFFFFF
_SEQ_HALF = 0x80000000


class _Stream:
    """One direction of a TCP connection, put back into the order it was
    written in. Positions count stream bytes from the first one (``base`` is
    its sequence number), so they never wrap; sequence numbers are turned
    into positions relative to the next expected byte, which stays right
    across the 32-bit wraparound as long as a window is under 2 GiB."""

    __slots__ = ("base", "position", "fin_position", "early", "early_bytes", "stats")

    def __init__(self, stats: dict[str, int]) -> None:
        self.base: int | None = None
        self.position = 0  # stream bytes delivered (or reported missing) so far
        #: Where the sender's FIN is (seen, or inferred from an acknowledgement).
        self.fin_position: int | None = None
        #: Segments ahead of a hole: heap of (position, ns, payload, wire length).
        self.early: list[tuple[int, int, bytes, int]] = []
        self.early_bytes = 0
        self.stats = stats

    def start(self, seq: int) -> None:
        """The stream's first byte has sequence number ``seq`` (first call wins)."""
        if self.base is None:
            self.base = seq & _SEQ_MASK

    def _distance(self, seq: int) -> int:
        """Signed distance from the next expected byte to ``seq``."""
        base = self.base
        assert base is not None, "distance asked of a stream not started"
        return ((seq - base - self.position + _SEQ_HALF) & _SEQ_MASK) - _SEQ_HALF

    def segment(self, ts: int, seq: int, payload: bytes, length: int, fin: bool, out: list[_Piece]) -> None:
        """Take in a segment of ``length`` wire bytes (``payload`` the
        captured prefix); append to ``out`` whatever became readable."""
        self.start(seq)
        distance = self._distance(seq)
        if fin and self.fin_position is None:
            self.fin_position = self.position + distance + length
        if not length:
            return
        if distance > 0:
            self._hold(ts, distance, payload, length, out)
            return
        if distance < 0:
            if distance + length <= 0:
                self.stats["retransmits"] += 1
                return
            self.stats["retransmits"] += 1
            payload, length = payload[-distance:], length + distance
        out.append((ts, payload, length - len(payload)))
        self.position += length
        if self.early:
            self._release(ts, out)

    def acknowledge(self, ts: int, ack: int, out: list[_Piece]) -> None:
        """The receiver acknowledged bytes up to ``ack``: any of them not seen
        passed all the same (the capture lost them), so report them missing.
        An acknowledgement just one past everything seen is taken for that
        of a FIN the capture lost (a FIN takes a sequence number, not a
        byte); were it a lost byte, the data after it would tell later."""
        if self.base is None:
            return
        distance = self._distance(ack)
        if distance <= 0:
            return
        if distance == 1 and not self.early:
            if self.fin_position is None:
                self.fin_position = self.position
            return
        target = self.position + distance
        if self.fin_position is not None:
            target = min(target, self.fin_position)  # the FIN takes a sequence number, not a byte
        self._skip_to(ts, target, out)

    def finish(self, ts: int, out: list[_Piece]) -> None:
        """The connection is over: flush what is held, holes reported missing
        up to the last byte known sent (the FIN's or the furthest held)."""
        target = max([self.position, self.fin_position or 0] + [p + n for p, _, _, n in self.early])
        self._skip_to(ts, target, out)

    def _hold(self, ts: int, distance: int, payload: bytes, length: int, out: list[_Piece]) -> None:
        self.stats["out_of_order"] += 1
        heapq.heappush(self.early, (self.position + distance, ts, payload, length))
        self.early_bytes += length
        while self.early_bytes > MAX_OUT_OF_ORDER_BYTES:
            self._skip_to(ts, self.early[0][0], out)

    def _release(self, ts: int, out: list[_Piece]) -> None:
        """Deliver held segments the stream has caught up with, at ``ts``
        (the time the hole filled, when a reader could first have them)."""
        early = self.early
        while early and early[0][0] <= self.position:
            start, _, payload, length = heapq.heappop(early)
            self.early_bytes -= length
            overlap = self.position - start
            if overlap >= length:
                self.stats["retransmits"] += 1
                continue
            if overlap:
                payload, length = payload[overlap:], length - overlap
            out.append((ts, payload, length - len(payload)))
            self.position += length

    def _skip_to(self, ts: int, target: int, out: list[_Piece]) -> None:
        """Advance to ``target``, reporting each gap not covered by a held
        segment as a hole of missing bytes."""
        early = self.early
        while self.position < target:
            if early and early[0][0] <= self.position:
                self._release(ts, out)
                continue
            gap_end = min(target, early[0][0]) if early else target
            gap = gap_end - self.position
            self.stats["holes"] += 1
            out.append((ts, b"", gap))
            self.position = gap_end
        self._release(ts, out)


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
    to_server: _Stream
    to_client: _Stream
    closed_at: int | None = None


class _FdTable:
    """File descriptors as a process gets them: the lowest free one, from 3."""

    def __init__(self) -> None:
        self._next = 3
        self._free: list[int] = []

    def allocate(self) -> int:
        if self._free:
            return heapq.heappop(self._free)
        self._next += 1
        return self._next - 1

    def release(self, fd: int) -> None:
        heapq.heappush(self._free, fd)


@dataclass(slots=True)
class _Chunk:
    """Stream bytes being gathered into one DataEvent (``capture_bytes`` mode)."""

    flow: _Flow
    from_client: bool
    ts: int
    parts: list[bytes] = field(default_factory=list)
    size: int = 0
    missing: int = 0


def _format_ip(raw: bytes) -> str:
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)


class PcapSource:
    """Events from a capture file, as the traced endpoints would have seen them.

    ``perspective``: trace the servers, the clients, or both sides of every
    connection. ``capture_bytes``: if set, consecutive stream bytes moving
    the same way are gathered into DataEvents of up to that many captured
    bytes, like reads and writes of that size (nothing is dropped); if None,
    each TCP segment is one event. The file is opened and checked here, so a
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
        self.stats = _new_stats()
        #: pid -> the synthetic process it stands for. An entry appears before
        #: the first event that carries its pid.
        self.endpoints: dict[int, Endpoint] = {}
        _open_capture(path, _new_stats()).close()

    def events(self) -> Iterator[Event]:
        """Replay the file: ConnOpen, DataEvents, ConnClose per connection and
        traced side, in capture order (which is timestamp order for files
        tcpdump writes). Resets :attr:`stats` and :attr:`endpoints`."""
        self.stats = _new_stats()
        self.endpoints = {}
        return _Replay(self).run()


class _Replay:
    """The state of one pass over the file."""

    def __init__(self, source: PcapSource) -> None:
        self.path = source.path
        self.stats = source.stats
        self.endpoints = source.endpoints
        self.trace_servers = source.perspective in ("server", "both")
        self.trace_clients = source.perspective in ("client", "both")
        self.capture_bytes = source.capture_bytes
        #: Both keys of every open or recently closed flow -> (flow, key is the client's).
        self.flows: dict[_FlowKey, tuple[_Flow, bool]] = {}
        self.open_flows: dict[_Flow, None] = {}  # insertion-ordered set
        self.recently_closed: deque[tuple[int, _Flow]] = deque()  # (closed at, flow), oldest first
        self.servers: set[tuple[bytes, int]] = set()
        self.endpoint_uses: dict[tuple[bytes, int], int] = {}
        self.pids: dict[tuple[bytes, int | None], int] = {}
        self.fds: dict[int, _FdTable] = {}
        self.last_conn_id = 0
        self.chunk: _Chunk | None = None
        self.out: list[Event] = []

    def run(self) -> Iterator[Event]:
        stats, out = self.stats, self.out
        last_ts = 0
        reader = _open_capture(self.path, stats)
        try:
            for ts, link_type, frame in reader.frames():
                stats["packets"] += 1
                last_ts = ts
                segment = _decode_segment(link_type, frame, stats)
                if segment is not None:
                    self.on_segment(ts, segment)
                    if out:
                        yield from out
                        out.clear()
        finally:
            reader.close()
        for flow in list(self.open_flows):
            self.close(flow, last_ts)
        yield from out
        out.clear()

    def on_segment(self, ts: int, segment: _Segment) -> None:
        """Feed one segment to its connection's reassembly; queue the events."""
        found = self.find_flow(ts, segment)
        if found is None:
            return
        flow, from_client = found
        _, _, _, _, seq, ack, flags, payload, missing = segment
        if flags & _TH_SYN:
            (flow.to_server if from_client else flow.to_client).start(seq + 1)
            if flags & _TH_ACK:
                (flow.to_client if from_client else flow.to_server).start(ack)
            seq += 1
        sending, receiving = (flow.to_server, flow.to_client) if from_client else (flow.to_client, flow.to_server)
        if flags & _TH_ACK:
            acknowledged: list[_Piece] = []
            receiving.acknowledge(ts, ack, acknowledged)
            if acknowledged:
                self.emit(flow, not from_client, acknowledged)
        length = len(payload) + missing
        fin = bool(flags & _TH_FIN)
        if length or fin:
            pieces: list[_Piece] = []
            sending.segment(ts, seq, payload, length, fin, pieces)
            if pieces:
                self.emit(flow, from_client, pieces)
        if flags & _TH_RST or (flow.to_server.fin_position is not None and flow.to_client.fin_position is not None):
            self.close(flow, ts)  # at the RST or the later FIN

    def find_flow(self, ts: int, segment: _Segment) -> tuple[_Flow, bool] | None:
        """The open connection ``segment`` belongs to and whether its client
        sent it; a new connection if it opens one; None to ignore it."""
        src, sport, dst, dport, seq, _, flags, _, _ = segment
        known = self.flows.get((src, sport, dst, dport))
        if known is None:
            return self.new_flow(ts, segment)
        flow = known[0]
        opening = flags & (_TH_SYN | _TH_ACK) == _TH_SYN
        if flow.closed_at is not None:
            if not opening and ts - flow.closed_at <= CLOSED_CONNECTION_MEMORY_NS:
                return None  # a straggler of a connection just closed
            return self.new_flow(ts, segment)
        if opening and flow.client_isn != seq:
            self.close(flow, ts)  # the addresses are being reused
            return self.new_flow(ts, segment)
        return known

    def new_flow(self, ts: int, segment: _Segment) -> tuple[_Flow, bool] | None:
        """Start tracking the connection ``segment`` belongs to, or None if
        the segment does not show where one starts (see the module doc)."""
        src, sport, dst, dport, seq, _, flags, payload, missing = segment
        handshake = bool(flags & _TH_SYN)
        if handshake:
            sent_by_client = not flags & _TH_ACK
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
        flow = _Flow(client_isn, keys, fanout, sides, _Stream(self.stats), _Stream(self.stats))
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
        client_ip, server_ip = _format_ip(client[0]), _format_ip(server[0])
        from_client: list[tuple[int, int, int, Direction]] = []
        from_server: list[tuple[int, int, int, Direction]] = []
        sides: list[tuple[int, int, int]] = []
        if self.trace_clients:
            pid = self.pid_for("client", client[0], None)
            fd, conn_id = self.fds[pid].allocate(), self.next_conn_id()
            hint = RoleHint.CONNECTED if handshake else RoleHint.UNKNOWN
            self.out.append(ConnOpen(ts, pid, pid, fd, conn_id, family, client_ip, client[1], server_ip, server[1], hint))
            sides.append((pid, fd, conn_id))
            from_client.append((pid, fd, conn_id, Direction.EGRESS))
            from_server.append((pid, fd, conn_id, Direction.INGRESS))
        if self.trace_servers:
            pid = self.pid_for("server", server[0], server[1])
            fd, conn_id = self.fds[pid].allocate(), self.next_conn_id()
            hint = RoleHint.ACCEPTED if handshake else RoleHint.UNKNOWN
            self.out.append(ConnOpen(ts, pid, pid, fd, conn_id, family, server_ip, server[1], client_ip, client[1], hint))
            sides.append((pid, fd, conn_id))
            from_client.append((pid, fd, conn_id, Direction.INGRESS))
            from_server.insert(0, (pid, fd, conn_id, Direction.EGRESS))
        return (tuple(from_server), tuple(from_client)), sides

    def pid_for(self, role: Role, ip: bytes, port: int | None) -> int:
        key = (ip, port)
        pid = self.pids.get(key)
        if pid is None:
            pid = self.pids[key] = len(self.pids) + 1
            text = _format_ip(ip)
            if role == "server":
                name = f"[{text}]:{port}" if ":" in text else f"{text}:{port}"
            else:
                name = f"client {text}"
            self.endpoints[pid] = Endpoint(pid, role, text, port, name)
            self.fds[pid] = _FdTable()
        return pid

    def next_conn_id(self) -> int:
        self.last_conn_id += 1
        return self.last_conn_id

    def close(self, flow: _Flow, ts: int) -> None:
        """The connection ended (both FINs, a RST, reuse, or end of file):
        flush both directions, then a ConnClose per traced side."""
        for stream, from_client in ((flow.to_server, True), (flow.to_client, False)):
            pieces: list[_Piece] = []
            stream.finish(ts, pieces)
            if pieces:
                self.emit(flow, from_client, pieces)
        self.flush_chunk()
        for pid, fd, conn_id in flow.sides:
            self.out.append(ConnClose(ts, pid, pid, fd, conn_id))
            self.fds[pid].release(fd)
        flow.closed_at = ts
        del self.open_flows[flow]
        self.recently_closed.append((ts, flow))

    def emit(self, flow: _Flow, from_client: bool, pieces: list[_Piece]) -> None:
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

    def gather(self, flow: _Flow, from_client: bool, pieces: list[_Piece]) -> None:
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
