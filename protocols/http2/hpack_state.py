"""HPACK decoding that survives joining a connection late.

A connection opened before the agent started has an HPACK dynamic table the
agent never saw being built. ``hpack.Decoder`` then fails on the first
reference to an old entry, and everything after it is lost. This decoder
(built on ``hpack``'s integer and Huffman primitives and its static table)
keeps going:

* **Positions, not contents, are what the table needs.** Dynamic entries are
  numbered newest first. Every entry inserted since the agent joined is known
  and sits at the front, in the right position; entries older than the agent
  sit behind them, unknown. A reference into the known front decodes; one
  behind it yields an *unknown field* (counted in the block's ``unknown``),
  never a wrong value.
* **Insertions stay aligned** even when their own name is unknown (a literal
  whose name refers to an old entry): a placeholder takes the position.
* **Trust comes back** (``complete`` True, every live entry known) when

  1. a dynamic-table size update makes room for no unknown entry (size 0
     empties the table),
  2. the known entries fill the table: their total size (a lower bound when
     placeholders are among them) leaves less than the 32 bytes the smallest
     entry takes, so no older entry can still be live, or
  3. an inserted entry is larger than the table (RFC 7541 4.4 empties it).

  Assumes the table's maximum is the SETTINGS_HEADER_TABLE_SIZE last seen
  (4096 by default) when the connection began before the agent.
* A block whose fields all decoded is complete even while the table is not
  (static entries, literals and known entries only).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hpack.hpack import HPACKDecodingError, decode_huffman, decode_integer
from hpack.table import HeaderTable

STATIC_TABLE: tuple[tuple[bytes, bytes], ...] = HeaderTable.STATIC_TABLE
_STATIC_LEN = len(STATIC_TABLE)
#: RFC 7541 4.1: an entry's size is its name and value lengths plus 32.
ENTRY_OVERHEAD = 32
DEFAULT_TABLE_SIZE = 4096


@dataclass(slots=True)
class DecodedBlock:
    """One header block: the fields that decoded, in order, and what did not."""

    headers: list[tuple[str, str]] = field(default_factory=list)
    #: Fields that referred to dynamic entries older than the agent.
    unknown: int = 0
    #: The block was malformed (bad integer, Huffman, index 0 ...): decoding stopped there.
    malformed: bool = False


class TolerantDecoder:
    """An HPACK decoder for one direction of one connection (see the module docstring).

    ``complete``: whether the dynamic table is known in full (True when the
    connection was seen from its start).
    """

    def __init__(self, complete: bool = True, max_size: int = DEFAULT_TABLE_SIZE) -> None:
        self.complete = complete
        self.max_size = max_size
        # Newest first: (name, value, size); name or value None = unknown (placeholder).
        self._entries: deque[tuple[bytes | None, bytes | None, int]] = deque()
        self._size = 0
        #: How many times trust came back (a test and a self-metric can read it).
        self.recoveries = 0

    # -- table ---------------------------------------------------------------

    def forget(self) -> None:
        """Bytes of this direction were lost: positions can no longer be trusted."""
        self._entries.clear()
        self._size = 0
        self.complete = False

    def set_max_size(self, size: int) -> None:
        """SETTINGS_HEADER_TABLE_SIZE from the peer (the bound the encoder works under)."""
        self.max_size = size
        self._evict()
        self._check_filled()

    def _lookup(self, index: int) -> tuple[bytes | None, bytes | None] | None:
        """The (name, value) at ``index``; (None, None) for an unknown entry; None if invalid."""
        if index <= 0:
            return None
        if index <= _STATIC_LEN:
            return STATIC_TABLE[index - 1]
        position = index - _STATIC_LEN - 1
        if position < len(self._entries):
            name, value, _ = self._entries[position]
            return name, value
        if self.complete:
            # A trusted table lacks it: our maximum was too small. Distrust, do not fail.
            self.complete = False
        return (None, None)

    def _add(self, name: bytes | None, value: bytes | None) -> None:
        size = len(name or b"") + len(value or b"") + ENTRY_OVERHEAD
        if size > self.max_size:
            self._entries.clear()
            self._size = 0
            self._trust()
            return
        self._entries.appendleft((name, value, size))
        self._size += size
        self._evict()
        self._check_filled()

    def _evict(self) -> None:
        while self._size > self.max_size and self._entries:
            self._size -= self._entries.pop()[2]

    def _resize(self, size: int) -> None:
        self.max_size = size
        self._evict()
        self._check_filled()

    def _check_filled(self) -> None:
        if not self.complete and self._size + ENTRY_OVERHEAD > self.max_size:
            self._trust()

    def _trust(self) -> None:
        if not self.complete:
            self.complete = True
            self.recoveries += 1

    # -- decoding -----------------------------------------------------------

    def decode(self, block: bytes) -> DecodedBlock:
        """Decode one complete header block (HEADERS + CONTINUATION payloads). Never raises."""
        out = DecodedBlock()
        data = memoryview(block)
        pos = 0
        end = len(data)
        try:
            while pos < end:
                first = data[pos]
                if first & 0x80:  # indexed field
                    index, used = decode_integer(data[pos:], 7)
                    pos += used
                    entry = self._lookup(index)
                    if entry is None:
                        out.malformed = True
                        return out
                    self._emit(out, entry[0], entry[1])
                elif first & 0x40:  # literal with incremental indexing
                    name, value, pos, ok = self._literal(data, pos, 6)
                    if not ok:
                        out.malformed = True
                        return out
                    self._add(name, value)
                    self._emit(out, name, value)
                elif first & 0x20:  # dynamic table size update
                    size, used = decode_integer(data[pos:], 5)
                    pos += used
                    self._resize(size)
                else:  # literal without indexing / never indexed
                    name, value, pos, ok = self._literal(data, pos, 4)
                    if not ok:
                        out.malformed = True
                        return out
                    self._emit(out, name, value)
        except (HPACKDecodingError, IndexError, ValueError):
            out.malformed = True
        return out

    @staticmethod
    def _emit(out: DecodedBlock, name: bytes | None, value: bytes | None) -> None:
        if name is None or value is None:
            out.unknown += 1
        else:
            out.headers.append((name.decode("latin-1").lower(), value.decode("latin-1").strip()))

    def _literal(self, data: memoryview, pos: int, prefix: int) -> tuple[bytes | None, bytes | None, int, bool]:
        index, used = decode_integer(data[pos:], prefix)
        pos += used
        if index:
            entry = self._lookup(index)
            if entry is None:
                return None, None, pos, False
            name = entry[0]
        else:
            name, pos = _string(data, pos)
        value, pos = _string(data, pos)
        return name, value, pos, True


def _string(data: memoryview, pos: int) -> tuple[bytes, int]:
    """An HPACK string literal at ``pos`` (Huffman or raw); raises on a short buffer."""
    huffman = data[pos] & 0x80
    length, used = decode_integer(data[pos:], 7)
    pos += used
    if pos + length > len(data):
        raise ValueError("string past the end of the block")
    # No cut: a string lies inside its block, which the session bounds (MAX_HEADER_BLOCK),
    # and its full length is what the table's size accounting needs.
    raw = data[pos : pos + length]
    value = decode_huffman(raw) if huffman else bytes(raw)
    return value, pos + length
