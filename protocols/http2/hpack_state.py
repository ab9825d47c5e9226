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
from dataclasses import dataclass

from hpack.hpack import HPACKDecodingError, decode_huffman, decode_integer
from hpack.table import HeaderTable

STATIC_TABLE: tuple[tuple[bytes, bytes], ...] = HeaderTable.STATIC_TABLE
_STATIC_LEN = len(STATIC_TABLE)
#: RFC 7541 4.1: an entry's size is its name and value lengths plus 32.
ENTRY_OVERHEAD = 32
DEFAULT_TABLE_SIZE = 4096


def _field(name: bytes | None, value: bytes | None) -> tuple[str, str] | None:
    """A field as the session reads it (lower-case name, stripped value); None if unknown."""
    if name is None or value is None:
        return None
    return name.decode("latin-1").lower(), value.decode("latin-1").strip()


#: Table entries: (name, value, size, field), ``field`` decoded once (``_field``), when the
#: entry is made, not each time a block refers to it; an unknown entry's parts are None.
_STATIC_ENTRIES = tuple((name, value, 0, _field(name, value)) for name, value in STATIC_TABLE)
_UNKNOWN_ENTRY: tuple[None, None, int, None] = (None, None, 0, None)
#: Blocks remembered per decoder, and the longest remembered (see TolerantDecoder.decode):
#: at most 1 KiB of keys per direction, a quarter of the default table it stands for.
_MEMO_BLOCKS = 4
_MEMO_BLOCK_LEN = 256

#: Huffman-coded strings already decoded (``decode_huffman`` is pure Python and costs
#: ~1 us per few bytes): header values repeat from request to request. Bounded like the
#: HTTP/1 parser's memos: emptied when full, no key longer than _HUFFMAN_KEPT_LEN.
_HUFFMAN: dict[bytes, bytes] = {}
_HUFFMAN_KEPT = 4096
_HUFFMAN_KEPT_LEN = 256


@dataclass
class DecodedBlock:
    """One header block: the fields that decoded, in order, and what did not.

    A dataclass over an explicit ``__init__`` and ``__slots__``, as protocols/http1/types.py
    explains: an extension type with a C ``__init__`` when compiled (hpack_state.pxd)."""

    __slots__ = ("headers", "unknown", "malformed")
    headers: list[tuple[str, str]]
    #: Fields that referred to dynamic entries older than the agent.
    unknown: int
    #: The block was malformed (bad integer, Huffman, index 0 ...): decoding stopped there.
    malformed: bool

    def __init__(self, headers=None, unknown=0, malformed=False) -> None:
        self.headers = [] if headers is None else headers
        self.unknown = unknown
        self.malformed = malformed


class TolerantDecoder:
    """An HPACK decoder for one direction of one connection (see the module docstring).

    ``complete``: whether the dynamic table is known in full (True when the
    connection was seen from its start).
    """

    def __init__(self, complete: bool = True, max_size: int = DEFAULT_TABLE_SIZE) -> None:
        self.complete = complete
        self.max_size = max_size
        # Newest first: (name, value, size, field); name or value None = unknown (placeholder).
        self._entries: deque[tuple[bytes | None, bytes | None, int, tuple[str, str] | None]] = deque()
        self._size = 0
        #: How many times trust came back (a test and a self-metric can read it).
        self.recoveries = 0
        #: Blocks that changed nothing in the table, by their bytes -> the fields they
        #: decoded to. Valid while the table stays as it is: emptied by every change.
        self._memo: dict[bytes, tuple[tuple[str, str], ...]] = {}
        #: Table changes so far (insertions, size updates, forgetting).
        self._changes = 0

    def _changed(self) -> None:
        """The table changed: what a remembered block decodes to may differ now."""
        self._changes += 1
        if self._memo:
            self._memo.clear()

    # -- table ---------------------------------------------------------------

    def forget(self) -> None:
        """Bytes of this direction were lost: positions can no longer be trusted."""
        self._changed()
        self._entries.clear()
        self._size = 0
        self.complete = False

    def set_max_size(self, size: int) -> None:
        """SETTINGS_HEADER_TABLE_SIZE from the peer (the bound the encoder works under)."""
        self._changed()
        self.max_size = size
        self._evict()
        self._check_filled()

    def _lookup(self, index: int) -> tuple[bytes | None, bytes | None, int, tuple[str, str] | None] | None:
        """The entry (name, value, size, field) at ``index``; the unknown entry for one
        older than the agent; None if invalid."""
        if index <= 0:
            return None
        if index <= _STATIC_LEN:
            return _STATIC_ENTRIES[index - 1]
        position = index - _STATIC_LEN - 1
        if position < len(self._entries):
            return self._entries[position]
        if self.complete:
            # A trusted table lacks it: our maximum was too small. Distrust, do not fail.
            self.complete = False
        return _UNKNOWN_ENTRY

    def _add(self, name: bytes | None, value: bytes | None, decoded: tuple[str, str] | None) -> None:
        self._changed()
        size = len(name or b"") + len(value or b"") + ENTRY_OVERHEAD
        if size > self.max_size:
            self._entries.clear()
            self._size = 0
            self._trust()
            return
        self._entries.appendleft((name, value, size, decoded))
        self._size += size
        self._evict()
        self._check_filled()

    def _evict(self) -> None:
        while self._size > self.max_size and self._entries:
            self._size -= self._entries.pop()[2]

    def _resize(self, size: int) -> None:
        self._changed()
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
        """Decode one complete header block (HEADERS + CONTINUATION payloads). Never raises.

        A block that changes nothing in the table (only references and literals not
        indexed) and decodes whole is remembered by its bytes until the table next
        changes: a connection's requests and responses repeat the same few blocks once
        their fields are indexed (gRPC's, call after call), and each is then decoded once.
        """
        memo = self._memo
        if memo and type(block) is bytes:
            known = memo.get(block)
            if known is not None:
                return DecodedBlock(list(known))
        changes = self._changes
        out = self._decode(block)
        if (
            changes == self._changes
            and not out.unknown
            and not out.malformed
            and type(block) is bytes
            and len(block) <= _MEMO_BLOCK_LEN
        ):
            if len(memo) >= _MEMO_BLOCKS:
                memo.clear()
            memo[block] = tuple(out.headers)
        return out

    def _decode(self, block: bytes) -> DecodedBlock:
        out = DecodedBlock()
        data = memoryview(block)
        pos = 0
        end = len(data)
        try:
            while pos < end:
                first = data[pos]
                if first & 0x80:  # indexed field
                    index, pos = _integer(data, pos, 7)
                    entry = self._lookup(index)
                    if entry is None:
                        out.malformed = True
                        return out
                    _emit(out, entry[3])
                elif first & 0x40:  # literal with incremental indexing
                    name, value, pos, ok = self._literal(data, pos, 6)
                    if not ok:
                        out.malformed = True
                        return out
                    decoded = _field(name, value)
                    self._add(name, value, decoded)
                    _emit(out, decoded)
                elif first & 0x20:  # dynamic table size update
                    size, pos = _integer(data, pos, 5)
                    self._resize(size)
                else:  # literal without indexing / never indexed
                    name, value, pos, ok = self._literal(data, pos, 4)
                    if not ok:
                        out.malformed = True
                        return out
                    _emit(out, _field(name, value))
        except (HPACKDecodingError, IndexError, ValueError):
            out.malformed = True
        return out

    def _literal(self, data: memoryview, pos: int, prefix: int) -> tuple[bytes | None, bytes | None, int, bool]:
        index, pos = _integer(data, pos, prefix)
        if index:
            entry = self._lookup(index)
            if entry is None:
                return None, None, pos, False
            name = entry[0]
        else:
            name, pos = _string(data, pos)
        value, pos = _string(data, pos)
        return name, value, pos, True


def _emit(out: DecodedBlock, decoded: tuple[str, str] | None) -> None:
    if decoded is None:
        out.unknown += 1
    else:
        out.headers.append(decoded)


def _integer(data: memoryview, pos: int, prefix: int) -> tuple[int, int]:
    """The HPACK integer at ``pos`` with a ``prefix``-bit prefix, and the position after it.
    Most fit their prefix (one byte, read here); longer ones go to hpack's decoder."""
    mask = (1 << prefix) - 1
    value = data[pos] & mask
    if value < mask:
        return value, pos + 1
    value, used = decode_integer(data[pos:], prefix)
    return value, pos + used


def _string(data: memoryview, pos: int) -> tuple[bytes, int]:
    """An HPACK string literal at ``pos`` (Huffman or raw); raises on a short buffer."""
    huffman = data[pos] & 0x80
    length, pos = _integer(data, pos, 7)
    if pos + length > len(data):
        raise ValueError("string past the end of the block")
    # No cut: a string lies inside its block, which the session bounds (MAX_HEADER_BLOCK),
    # and its full length is what the table's size accounting needs.
    raw = bytes(data[pos : pos + length])
    value = _huffman(raw) if huffman else raw
    return value, pos + length


def _huffman(raw: bytes) -> bytes:
    """``decode_huffman(raw)``, remembered (``_HUFFMAN``); raises as it does."""
    value = _HUFFMAN.get(raw)
    if value is None:
        value = decode_huffman(raw)
        if len(raw) <= _HUFFMAN_KEPT_LEN:
            if len(_HUFFMAN) >= _HUFFMAN_KEPT:
                _HUFFMAN.clear()
            _HUFFMAN[raw] = value
    return value
