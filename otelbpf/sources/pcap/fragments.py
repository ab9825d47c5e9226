"""IPv4 fragments put back together into the datagrams they were cut from.

A TCP segment or UDP datagram larger than a link's MTU crosses it in IPv4
fragments; the receiving kernel reassembles them before any socket sees the
bytes, so the replay does too (:class:`Ipv4Fragments`, used by
``otelbpf.sources.pcap.link`` as it decodes IPv4). IPv6 fragments are
counted and dropped there (rare: IPv6 routers never fragment).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

#: IPv4 fragments of one datagram are given up on this long after the first
#: arrived (Linux's ipfrag_time), or when more datagrams than this are being
#: put together at once (the oldest goes).
FRAGMENT_TIMEOUT_NS = 30 * 1_000_000_000
MAX_PENDING_DATAGRAMS = 1024

_IP_MORE_FRAGMENTS = 0x2000
_IP_OFFSET_MASK = 0x1FFF


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
