"""Link layer and IP: find the IP header in a frame, decode IPv4/IPv6 and the
TCP segment or UDP datagram in it.

dpkt decodes IP, TCP and UDP. Skipping the link-layer header is done here
instead: dpkt's link decoders decode every layer eagerly, which alone would
cost more than the whole per-packet budget.

Every packet handed to :func:`decode_packet` is counted once in the stats,
by outcome: ``tcp_segments``, ``udp_datagrams``, ``ip_fragments`` (an IPv4
fragment of TCP or UDP, kept for reassembly, or an IPv6 fragment, dropped),
``unsupported`` or ``malformed``. A datagram rebuilt from fragments is
decoded and counted again, as the packet its fragments made
(``fragments_reassembled`` counts those).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable

import dpkt

from otelbpf.sources.pcap.fragments import Ipv4Fragments

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
LINK_DECODERS: dict[int, Callable[[bytes], int]] = {
    dpkt.pcap.DLT_EN10MB: _ip_after_ethernet,
    dpkt.pcap.DLT_LINUX_SLL: _ip_after_sll,
    dpkt.pcap.DLT_LINUX_SLL2: _ip_after_sll2,
    dpkt.pcap.DLT_NULL: _ip_after_loopback,
    108: _ip_after_loopback,  # LINKTYPE_LOOP (dpkt's DLT_LOOP is 12 on OpenBSD)
    101: _ip_at_start,  # LINKTYPE_RAW
    dpkt.pcap.DLT_IPV4: _ip_at_start,
    dpkt.pcap.DLT_IPV6: _ip_at_start,
}


# --- IP, TCP and UDP -------------------------------------------------------------

#: A decoded TCP segment: (src ip bytes, src port, dst ip bytes, dst port, seq,
#: ack, flags, captured payload, payload bytes on the wire but not captured).
Segment = tuple[bytes, int, bytes, int, int, int, int, bytes, int]


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


TH_FIN, TH_SYN, TH_RST, TH_ACK = dpkt.tcp.TH_FIN, dpkt.tcp.TH_SYN, dpkt.tcp.TH_RST, dpkt.tcp.TH_ACK
_IP_FRAGMENT_BITS = 0x3FFF  # more-fragments flag and fragment offset
_IP_PROTO_TCP = dpkt.ip.IP_PROTO_TCP
_IP_PROTO_UDP = dpkt.ip.IP_PROTO_UDP
_UDP_HEADER = 8


def decode_packet(
    link_type: int, frame: bytes, ts: int, stats: dict[str, int], fragments: Ipv4Fragments
) -> Segment | Datagram | None:
    """The TCP segment (a tuple) or UDP datagram in ``frame``, or None
    (counted in ``stats`` by reason). ``fragments`` keeps IPv4 fragments
    until their datagram is whole."""
    locate_ip = LINK_DECODERS.get(link_type)
    offset = locate_ip(frame) if locate_ip is not None else -1
    version = frame[offset] >> 4 if 0 <= offset < len(frame) else 0
    try:
        if version == 4:
            return _decode_ipv4(frame[offset:], ts, stats, fragments)
        if version == 6:
            return _decode_ipv6(frame[offset:], stats)
    except (dpkt.UnpackError, struct.error):
        stats["malformed"] += 1
        return None
    stats["unsupported"] += 1
    return None


def _decode_ipv4(packet: bytes, ts: int, stats: dict[str, int], fragments: Ipv4Fragments) -> Segment | Datagram | None:
    ip = dpkt.ip.IP(packet)
    protocol = ip.p
    if protocol != _IP_PROTO_TCP and protocol != _IP_PROTO_UDP:
        stats["unsupported"] += 1
        return None
    if ip._flags_offset & _IP_FRAGMENT_BITS:
        stats["ip_fragments"] += 1
        whole = fragments.add(ts, ip, packet)
        if whole is None:
            return None
        stats["fragments_reassembled"] += 1
        transport = dpkt.tcp.TCP(whole) if protocol == _IP_PROTO_TCP else dpkt.udp.UDP(whole)
        wire_length: int | None = len(whole)
    else:
        transport = ip.data
        # ip.len is 0 in packets captured before TCP segmentation offload split them.
        wire_length = ip.len - (ip.hl << 2) if ip.len else None
    if protocol == _IP_PROTO_TCP:
        return _segment(ip.src, ip.dst, transport, wire_length, stats)
    return _datagram(ip.src, ip.dst, transport, wire_length, stats)


def _decode_ipv6(packet: bytes, stats: dict[str, int]) -> Segment | Datagram | None:
    ip = dpkt.ip6.IP6(packet)
    protocol = ip.p
    if protocol != _IP_PROTO_TCP and protocol != _IP_PROTO_UDP:
        stats["unsupported"] += 1
        return None
    if dpkt.ip.IP_PROTO_FRAGMENT in ip.extension_hdrs:
        stats["ip_fragments"] += 1
        stats["fragments_dropped"] += 1  # not reassembled (rare: IPv6 routers never fragment)
        return None
    extensions = sum(header.length for header in ip.all_extension_headers)
    wire_length = ip.plen - extensions if ip.plen else None
    if protocol == _IP_PROTO_TCP:
        return _segment(ip.src, ip.dst, ip.data, wire_length, stats)
    return _datagram(ip.src, ip.dst, ip.data, wire_length, stats)


def _segment(src: bytes, dst: bytes, tcp: object, wire_length: int | None, stats: dict[str, int]) -> Segment | None:
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


def _datagram(src: bytes, dst: bytes, udp: object, wire_length: int | None, stats: dict[str, int]) -> Datagram | None:
    """``wire_length``: UDP header and payload bytes as the IP header counts
    them (None: trust the UDP length field)."""
    if not isinstance(udp, dpkt.udp.UDP):  # header cut short
        stats["malformed"] += 1
        return None
    if wire_length is None:
        wire_length = udp.ulen or _UDP_HEADER + len(udp.data)
    size = wire_length - _UDP_HEADER
    if size < 0:
        stats["malformed"] += 1
        return None
    stats["udp_datagrams"] += 1
    payload = udp.data
    if len(payload) > size:
        payload = payload[:size]
    missing = size - len(payload)
    if missing:
        stats["truncated_packets"] += 1
    return Datagram(src, udp.sport, dst, udp.dport, payload, missing)
