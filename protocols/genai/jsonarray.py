"""A JSON array streamed element by element, incremental and bounded.

How Gemini's ``streamGenerateContent`` answers without ``?alt=sse``: one JSON array,
written a response object at a time (``[{...}\\n,\\r\\n{...}\\n]``), so a client (and the
agent) can read each object as soon as its closing brace arrives.

:class:`JsonArrayStream` turns the bytes, fed in any pieces, into one
:class:`~protocols.genai.sse.SseEvent` per object or array element of the top-level array
(``data``: the element's bytes; unnamed), the same whatever the piece boundaries. It
follows strings and escapes to find where an element ends, without decoding it. Scalar
elements are skipped. An element longer than ``limit`` keeps its first ``limit`` bytes and
its last ``tail`` bytes and is dispatched ``truncated``; its nesting is followed to the
end (at most ``MAX_DEPTH`` levels: deeper is not a response). Bytes that are not such an
array (anything before ``[`` but blanks, a stray byte between elements) are counted in
``errors`` and skipped. After a hole (:meth:`JsonArrayStream.gap`) the element in progress
is dropped and the stream resumes at the next ``}`` ``,`` ``{`` between two elements
(blanks allowed): a rare string holding those bytes may cost an element, never a crash.
Nothing here raises.
"""

from __future__ import annotations

import re

from protocols.genai.sse import SseEvent

#: Bytes kept of an element (the rest counted, its last TAIL bytes kept).
ELEMENT_LIMIT = 64 * 1024
#: Bytes kept of the end of an element longer than ELEMENT_LIMIT.
TAIL = 16 * 1024
#: Nesting followed inside an element.
MAX_DEPTH = 512

_BEFORE, _BETWEEN, _ELEMENT, _SCALAR, _AFTER, _RESYNC = 0, 1, 2, 3, 4, 5
_BLANKS = b" \t\r\n"
_STRUCTURE = re.compile(rb'["{}\[\]]')
_IN_STRING = re.compile(rb'["\\]')
_SCALAR_END = re.compile(rb"[,\]]")
_RESUME = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*(?=[{\[])")


class JsonArrayStream:
    """The elements of a JSON array fed in arbitrary pieces (see the module's doc)."""

    __slots__ = ("limit", "tail", "errors", "events", "gaps", "_state", "_depth", "_in_string", "_escape", "_kept",
                 "_end", "_size", "_carry")  # fmt: skip

    def __init__(self, limit: int = ELEMENT_LIMIT, tail: int = TAIL) -> None:
        self.limit = max(1, limit)
        self.tail = max(1, tail)
        #: Bytes that are not the array's (skipped), elements nested too deep.
        self.errors = 0
        #: Elements dispatched.
        self.events = 0
        #: Holes reported (:meth:`gap`).
        self.gaps = 0
        self._state = _BEFORE
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._kept = bytearray()  # the element's first ``limit`` bytes
        self._end = b""  # its last ``tail`` bytes
        self._size = 0
        self._carry = b""  # after a hole: the last bytes searched, where a boundary may begin

    @property
    def buffered(self) -> int:
        return len(self._kept) + len(self._end) + len(self._carry)

    def gap(self) -> None:
        """Bytes were lost here: the element in progress is dropped; the stream resumes at
        the next boundary between two elements."""
        self.gaps += 1
        if self._state == _AFTER:
            return
        self._reset_element()
        self._state = _RESYNC
        self._carry = b""

    def feed(self, data: bytes) -> list[SseEvent]:
        out: list[SseEvent] = []
        pos, size = 0, len(data)
        while pos < size:
            state = self._state
            if state == _ELEMENT:
                pos = self._element(data, pos, out)
            elif state == _BETWEEN or state == _BEFORE:
                byte = data[pos]
                if byte in _BLANKS:
                    pos += 1
                elif state == _BEFORE:
                    if byte == 0x5B:  # [
                        self._state = _BETWEEN
                    else:
                        self.errors += 1
                        self._state = _AFTER  # not an array: nothing more is read
                    pos += 1
                elif byte == 0x2C:  # , between elements
                    pos += 1
                elif byte == 0x5D:  # ] the end
                    self._state = _AFTER
                    pos += 1
                elif byte == 0x7B or byte == 0x5B:  # { or [: an element begins
                    self._state = _ELEMENT
                else:
                    self._state = _SCALAR  # a number, string or literal: skipped
            elif state == _SCALAR:
                pos = self._scalar(data, pos)
            elif state == _RESYNC:
                pos = self._resync(data, pos)
            else:  # _AFTER: nothing follows a whole array
                break
        return out

    def _element(self, data: bytes, pos: int, out: list[SseEvent]) -> int:
        """Follow the element from ``data[pos]`` to its end (or the piece's)."""
        start, size = pos, len(data)
        depth, in_string, escape = self._depth, self._in_string, self._escape
        done = False
        while pos < size:
            if escape:
                escape = False
                pos += 1
                continue
            if in_string:
                found = _IN_STRING.search(data, pos)
                if found is None:
                    pos = size
                    break
                pos = found.start()
                if data[pos] == 0x5C:  # \\: the next byte is escaped
                    escape = True
                else:
                    in_string = False
                pos += 1
                continue
            found = _STRUCTURE.search(data, pos)
            if found is None:
                pos = size
                break
            pos = found.start()
            byte = data[pos]
            pos += 1
            if byte == 0x22:
                in_string = True
            elif byte == 0x7B or byte == 0x5B:
                depth += 1
                if depth > MAX_DEPTH:
                    self.errors += 1
                    self._reset_element()
                    self._state = _RESYNC
                    return pos
            else:
                depth -= 1
                if depth == 0:
                    done = True
                    break
        self._depth, self._in_string, self._escape = depth, in_string, escape
        self._keep(data, start, pos)
        if done:
            self._dispatch(out)
        return pos

    def _keep(self, data: bytes, start: int, stop: int) -> None:
        if stop <= start:
            return
        self._size += stop - start
        room = self.limit - len(self._kept)
        if room > 0:
            self._kept += data[start : start + min(room, stop - start)]
        piece = data[max(start, stop - self.tail) : stop]
        self._end = piece if len(piece) >= self.tail else (self._end + piece)[-self.tail :]

    def _dispatch(self, out: list[SseEvent]) -> None:
        self.events += 1
        if self._size > len(self._kept):
            out.append(SseEvent(bytes(self._kept), "", True, bytes(self._end)))
        else:
            out.append(SseEvent(bytes(self._kept)))
        self._reset_element()
        self._state = _BETWEEN

    def _reset_element(self) -> None:
        self._depth = 0
        self._in_string = self._escape = False
        self._kept = bytearray()
        self._end = b""
        self._size = 0

    def _scalar(self, data: bytes, pos: int) -> int:
        """Skip a scalar element (strings may hold commas: followed as in an element)."""
        found = _SCALAR_END.search(data, pos)
        if found is None or data.find(b'"', pos, found.start()) >= 0:
            self.errors += 1  # not what an LLM stream holds: read no further
            self._state = _AFTER
            return len(data)
        self._state = _BETWEEN
        return found.start()

    def _resync(self, data: bytes, pos: int) -> int:
        """After a hole: find ``}``, ``,``, ``{`` between two elements (blanks allowed)."""
        carried = len(self._carry)
        text = self._carry + data[pos:]
        found = _RESUME.search(text)
        if found is None:
            self._carry = text[-64:]  # a boundary split across pieces
            return len(data)
        self._carry = b""
        self._state = _ELEMENT
        return pos + found.end() - carried  # the next element's first byte (never in the carry)
