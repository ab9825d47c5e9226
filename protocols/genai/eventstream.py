"""AWS's binary event stream (``application/vnd.amazon.eventstream``), incremental and bounded.

The framing of Bedrock Runtime's ``converse-stream`` and ``invoke-with-response-stream``
responses (and of other AWS streaming APIs). Each message::

    prelude   total length (4 bytes, big-endian), headers length (4), prelude CRC (4:
              CRC-32 of the first 8 bytes)
    headers   name length (1), name, value type (1), value; repeated
    payload   total - headers - 16 bytes
    CRC       4 bytes: CRC-32 of everything before it

Header value types: 0 true, 1 false (no value), 2 byte, 3 short, 4 int, 5 long, 6 bytes
(2-byte length), 7 string (2-byte length), 8 timestamp (8), 9 UUID (16). A message's
``:message-type`` is ``event`` (its name is ``:event-type``), ``exception``
(``:exception-type``) or ``error`` (``:error-code``).

:class:`EventStream` turns the bytes, fed in any pieces, into
:class:`~protocols.genai.sse.SseEvent` s (``event``: the event's name, or
``exception:NAME`` / ``error:CODE``; ``data``: its payload), the same whatever the
piece boundaries. Both CRCs are checked (``zlib.crc32``) and a failure is counted in
``errors``, never trusted: a message whose CRC is wrong is dropped (its prelude was
right, so the next one starts where it said); a prelude whose CRC is wrong (or whose
lengths are beyond AWS's limits) loses the framing, which resumes at the next 12 bytes
whose prelude CRC holds. A hole in the bytes (:meth:`EventStream.gap`) does the same.

Bounds: a payload keeps its first ``payload_limit`` bytes and its last ``tail`` bytes (an
event cut so is dispatched ``truncated`` with that ``tail``); headers up to AWS's 128 KiB;
the bytes held while the framing is lost are at most a prelude's. Nothing here raises.
"""

from __future__ import annotations

import struct
import zlib

from protocols.genai.sse import SseEvent

#: Payload bytes kept of a message (the rest counted, its last TAIL bytes kept).
PAYLOAD_LIMIT = 64 * 1024
#: Bytes kept of the end of a payload longer than PAYLOAD_LIMIT.
TAIL = 16 * 1024
#: AWS's limits: headers of at most 128 KiB, a payload of at most 16 MiB.
MAX_HEADERS = 128 * 1024
MAX_PAYLOAD = 16 * 1024 * 1024
_PRELUDE = 12
_MIN_MESSAGE = 16
_PRELUDE_STRUCT = struct.Struct(">III")
#: Header value sizes by type (-1: a 2-byte length then the value).
_VALUE_SIZES = {0: 0, 1: 0, 2: 1, 3: 2, 4: 4, 5: 8, 6: -1, 7: -1, 8: 8, 9: 16}
_STRING = 7


def prelude_at(data: bytes | bytearray, pos: int) -> tuple[int, int] | None:
    """(total length, headers length) of a prelude at ``data[pos:pos + 12]`` whose CRC
    holds and whose lengths are within AWS's limits; None otherwise."""
    total, headers, crc = _PRELUDE_STRUCT.unpack_from(data, pos)
    if zlib.crc32(data[pos : pos + 8]) != crc:
        return None
    if total < _MIN_MESSAGE or headers > MAX_HEADERS or headers > total - _MIN_MESSAGE:
        return None
    if total - headers - _MIN_MESSAGE > MAX_PAYLOAD:
        return None
    return total, headers


def parse_headers(data: bytes | bytearray) -> dict[str, str] | None:
    """The string-valued headers of a message (others skipped); None if malformed."""
    out: dict[str, str] = {}
    pos, end = 0, len(data)
    while pos < end:
        size = data[pos]
        pos += 1
        if size == 0 or pos + size + 1 > end:
            return None
        name = bytes(data[pos : pos + size]).decode("utf-8", "replace")
        pos += size
        kind = data[pos]
        pos += 1
        width = _VALUE_SIZES.get(kind)
        if width is None:
            return None
        if width < 0:
            if pos + 2 > end:
                return None
            width = int.from_bytes(data[pos : pos + 2], "big")
            pos += 2
            if pos + width > end:
                return None
            if kind == _STRING:
                out[name] = bytes(data[pos : pos + width]).decode("utf-8", "replace")
        elif pos + width > end:
            return None
        pos += width
    return out


def event_name(headers: dict[str, str]) -> str:
    """The name a message goes by: its event type, or ``exception:TYPE`` / ``error:CODE``."""
    kind = headers.get(":message-type", "event")
    if kind == "exception":
        return "exception:" + headers.get(":exception-type", "")
    if kind == "error":
        return "error:" + headers.get(":error-code", "")
    return headers.get(":event-type", "")


class EventStream:
    """Messages of an AWS event stream fed in arbitrary pieces (see the module's doc)."""

    __slots__ = (
        "payload_limit", "tail", "errors", "events", "gaps", "_pending", "_lost", "_total", "_headers_len", "_left",
        "_crc", "_kept", "_end", "_crc_bytes",
    )  # fmt: skip

    def __init__(self, payload_limit: int = PAYLOAD_LIMIT, tail: int = TAIL) -> None:
        self.payload_limit = max(1, payload_limit)
        self.tail = max(1, tail)
        #: Preludes or messages whose CRC failed, preludes beyond the limits, malformed headers.
        self.errors = 0
        #: Messages dispatched.
        self.events = 0
        #: Holes reported (:meth:`gap`).
        self.gaps = 0
        self._pending = bytearray()  # the prelude being gathered (or searched for, when lost)
        self._lost = False  # the framing is lost: a prelude is searched for
        self._total = 0  # the message being read (0: none)
        self._headers_len = 0
        self._left = 0  # bytes of its headers and payload still to come
        self._crc = 0
        self._kept = bytearray()  # its headers, then the first payload_limit bytes of its payload
        self._end = b""  # the last tail bytes of its headers and payload
        self._crc_bytes = bytearray()  # its final CRC, as it arrives

    @property
    def buffered(self) -> int:
        """Bytes held (bounded: a prelude, one message's headers, kept payload and tail)."""
        return len(self._pending) + len(self._kept) + len(self._end) + len(self._crc_bytes)

    def gap(self) -> None:
        """Bytes were lost here: the message in progress is dropped and the framing is
        searched for again (the next prelude whose CRC holds)."""
        self.gaps += 1
        self._total = 0
        self._kept = bytearray()
        self._end = b""
        self._crc_bytes = bytearray()
        self._pending = bytearray()
        self._lost = True

    def feed(self, data: bytes) -> list[SseEvent]:
        out: list[SseEvent] = []
        pos, size = 0, len(data)
        while pos < size:
            if self._total:
                pos = self._body(data, pos, out)
                continue
            # gather a prelude; when the framing is lost, search all that came for one
            pending = self._pending
            take = size - pos if self._lost else min(size - pos, _PRELUDE - len(pending))
            pending += data[pos : pos + take]
            pos += take
            if len(pending) < _PRELUDE:
                continue
            start = self._find_prelude(pending)
            if start < 0:
                del pending[: len(pending) - (_PRELUDE - 1)]  # keep what may begin a prelude
                continue
            self._begin(pending, start)
            rest = bytes(pending[start + _PRELUDE :])
            self._pending = bytearray()
            if rest:  # bytes gathered past the prelude while searching: they come first
                data = rest + data[pos:]
                pos, size = 0, len(data)
        return out

    def _find_prelude(self, pending: bytearray) -> int:
        """Where the first valid prelude in ``pending`` starts (-1: none yet). A bad
        prelude where one was due loses the framing (counted once per loss)."""
        first = 0
        if not self._lost:
            if prelude_at(pending, 0) is not None:
                return 0
            self.errors += 1
            self._lost = True
            first = 1
        for start in range(first, len(pending) - _PRELUDE + 1):
            if prelude_at(pending, start) is not None:
                self._lost = False
                return start
        return -1

    def _begin(self, pending: bytearray, start: int) -> None:
        prelude = bytes(pending[start : start + _PRELUDE])
        self._total, self._headers_len, _ = _PRELUDE_STRUCT.unpack(prelude)
        self._left = self._total - _PRELUDE - 4
        self._crc = zlib.crc32(prelude)
        self._kept = bytearray()
        self._end = b""
        self._crc_bytes = bytearray()
        self._lost = False

    def _body(self, data: bytes, pos: int, out: list[SseEvent]) -> int:
        """Read the current message's headers, payload and CRC from ``data[pos:]``."""
        size = len(data)
        if self._left:
            take = min(self._left, size - pos)
            piece = data[pos : pos + take]
            pos += take
            self._left -= take
            self._crc = zlib.crc32(piece, self._crc)
            room = self._headers_len + self.payload_limit - len(self._kept)
            if room > 0:
                self._kept += piece[:room]
            end = self._end
            self._end = piece[-self.tail :] if len(piece) >= self.tail else (end + piece)[-self.tail :]
        if not self._left and pos < size:
            take = min(4 - len(self._crc_bytes), size - pos)
            self._crc_bytes += data[pos : pos + take]
            pos += take
            if len(self._crc_bytes) == 4:
                self._dispatch(out)
        return pos

    def _dispatch(self, out: list[SseEvent]) -> None:
        total, headers_len = self._total, self._headers_len
        kept, end = self._kept, self._end
        crc_ok = int.from_bytes(self._crc_bytes, "big") == self._crc
        self._total = 0
        self._kept = bytearray()
        self._end = b""
        self._crc_bytes = bytearray()
        if not crc_ok:
            self.errors += 1  # not trusted: dropped (the prelude was right: the next message is where it said)
            return
        headers = parse_headers(kept[:headers_len])
        if headers is None:
            self.errors += 1
            return
        payload_len = total - headers_len - _MIN_MESSAGE
        payload = bytes(kept[headers_len:])
        self.events += 1
        if payload_len > len(payload):
            out.append(SseEvent(payload, event_name(headers), True, bytes(end[-min(self.tail, payload_len) :])))
        else:
            out.append(SseEvent(payload, event_name(headers)))


def encode_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream message with string ``headers`` (servers and tests write them)."""
    head = b"".join(
        bytes([len(name.encode())]) + name.encode() + bytes([_STRING]) + len(value.encode()).to_bytes(2, "big") + value.encode()
        for name, value in headers.items()
    )
    total = _PRELUDE + len(head) + len(payload) + 4
    prelude = struct.pack(">II", total, len(head))
    prelude += zlib.crc32(prelude).to_bytes(4, "big")
    message = prelude + head + payload
    return message + zlib.crc32(message).to_bytes(4, "big")
