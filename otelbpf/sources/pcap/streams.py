"""TCP stream reassembly: one direction of a connection, put back in order.

Segments are taken in capture order and the byte stream is rebuilt the way
the receiving kernel would: in sequence order, without retransmitted bytes,
with bytes that passed but are not in the capture (lost from it, or cut by
the snap length) reported as ``missing`` so parsers stay in step.
"""

from __future__ import annotations

import heapq

#: Bytes a direction may hold out of order, waiting for a hole to fill,
#: before the hole is given up on and reported as missing.
MAX_OUT_OF_ORDER_BYTES = 4 * 1024 * 1024

#: Stream bytes ready for a reader: (ns, captured bytes, bytes missing after them).
Piece = tuple[int, bytes, int]

_SEQ_MASK = 0xFFFFFFFF
_SEQ_HALF = 0x80000000


class Stream:
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

    def segment(self, ts: int, seq: int, payload: bytes, length: int, fin: bool, out: list[Piece]) -> None:
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

    def acknowledge(self, ts: int, ack: int, out: list[Piece]) -> None:
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

    def finish(self, ts: int, out: list[Piece]) -> None:
        """The connection is over: flush what is held, holes reported missing
        up to the last byte known sent (the FIN's or the furthest held)."""
        target = max([self.position, self.fin_position or 0] + [p + n for p, _, _, n in self.early])
        self._skip_to(ts, target, out)

    def _hold(self, ts: int, distance: int, payload: bytes, length: int, out: list[Piece]) -> None:
        self.stats["out_of_order"] += 1
        heapq.heappush(self.early, (self.position + distance, ts, payload, length))
        self.early_bytes += length
        while self.early_bytes > MAX_OUT_OF_ORDER_BYTES:
            self._skip_to(ts, self.early[0][0], out)

    def _release(self, ts: int, out: list[Piece]) -> None:
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

    def _skip_to(self, ts: int, target: int, out: list[Piece]) -> None:
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
