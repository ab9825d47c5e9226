"""Incremental Server-Sent Events (``text/event-stream``) parsing, bounded.

:class:`SseParser` follows the WHATWG event-stream interpretation: lines end
with CRLF, LF or CR; ``data:`` lines of one event are joined with LF; a blank
line dispatches the event; lines starting with ``:`` are comments; ``event:``
names the event; other fields are ignored. An event left without its blank
line when the stream ends is discarded (as browsers do).

Bounds (memory stays bounded whatever the input):

* a line longer than ``max_line`` bytes keeps its first ``max_line`` bytes
  (the rest is skipped, the line is marked truncated);
* an event's data longer than ``max_event`` bytes keeps its first
  ``max_event`` bytes and the event is dispatched with ``truncated=True``;
* a truncated event also carries the end of its last data line (``tail``,
  at most :data:`TAIL` bytes), so that trailing fields (the ``usage`` of a
  Responses API ``response.completed`` event, which repeats the whole
  output) can still be read.

Both cuts depend only on the content, never on where chunks split it, so any
chunking of a stream gives the same events. ``feed`` never raises.
:class:`LineSplitter` is the line layer alone (Ollama streams NDJSON: one JSON
object per line).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Longest line kept (bytes); longer lines are cut to this.
MAX_LINE = 64 * 1024
#: Longest event data kept (bytes); longer events are cut to this and marked.
MAX_EVENT = 64 * 1024
#: Longest ``event:`` name kept.
MAX_EVENT_NAME = 256
#: Bytes kept of the end of a cut line (and of a truncated event): where trailing fields such as ``usage`` are.
TAIL = 16 * 1024

_EOL = re.compile(rb"[\r\n]")


class LineSplitter:
    """Splits a byte stream into lines (CRLF, LF or CR), bounded.

    ``feed(data)`` returns ``(line, tail)`` pairs for every line that
    ``data`` completes, without its terminator. A line longer than
    ``max_line`` keeps its first ``max_line`` bytes, and ``tail`` holds the
    last bytes of the rest (at most ``tail`` bytes: a true suffix of the
    line); ``tail`` is None for a line kept whole.
    """

    __slots__ = ("max_line", "tail", "_partial", "_overflow", "_tail", "_after_cr", "_skip_first")

    def __init__(self, max_line: int = MAX_LINE, tail: int = TAIL) -> None:
        self.max_line = max(1, max_line)
        self.tail = max(1, tail)
        self._partial = bytearray()
        self._overflow = False
        self._tail = b""  # the end of an overflowing line, after its kept prefix
        self._after_cr = False  # the last byte seen was CR: a following LF is part of that line end
        self._skip_first = False  # after a gap: the first line completed is the end of a cut one

    @property
    def buffered(self) -> int:
        """Bytes held for the unfinished line (at most ``max_line`` + ``tail``)."""
        return len(self._partial) + len(self._tail)

    def idle(self) -> bool:
        """No line in progress (the next byte starts a line)."""
        return not self._partial and not self._overflow and not self._after_cr and not self._skip_first

    def gap(self, resumes_at_line: bool = False) -> None:
        """Bytes of the stream were lost here: forget the line in progress, and drop the
        first line completed after the gap (the end of a line whose start was lost),
        unless ``resumes_at_line`` (the caller knows a line starts right after it)."""
        self._partial.clear()
        self._overflow = False
        self._tail = b""
        self._after_cr = False
        self._skip_first = not resumes_at_line

    def feed(self, data: bytes) -> list[tuple[bytes, bytes | None]]:
        lines: list[tuple[bytes, bytes | None]] = []
        if not data:
            return lines
        if self._skip_first:
            match = _EOL.search(data)
            if match is None:
                return lines  # still inside the cut line
            self._skip_first = False
            eol = match.start()
            skip = eol + 2 if data[eol] == 0x0D and data[eol + 1 : eol + 2] == b"\n" else eol + 1
            if data[eol] == 0x0D and eol + 1 == len(data):
                self._after_cr = True
            data = data[skip:]
            if not data:
                return lines
        pos, end = 0, len(data)
        if self._after_cr:
            self._after_cr = False
            if data[0] == 0x0A:
                pos = 1
        while pos < end:
            match = _EOL.search(data, pos)
            if match is None:
                self._keep(data, pos, end)
                break
            eol = match.start()
            if self._partial or self._overflow:
                self._keep(data, pos, eol)
                lines.append((bytes(self._partial), self._tail if self._overflow else None))
                self._partial.clear()
                self._overflow = False
                self._tail = b""
            elif eol - pos > self.max_line:
                lines.append((data[pos : pos + self.max_line], data[max(pos + self.max_line, eol - self.tail) : eol]))
            else:
                lines.append((data[pos:eol], None))
            if data[eol] == 0x0D:
                if eol + 1 == end:
                    self._after_cr = True
                    pos = end
                elif data[eol + 1] == 0x0A:
                    pos = eol + 2
                else:
                    pos = eol + 1
            else:
                pos = eol + 1
        return lines

    def pending(self) -> tuple[bytes, bytes | None] | None:
        """The unfinished last line (stream ended without a line end), or None."""
        if not self._partial and not self._overflow:
            return None
        return bytes(self._partial), (self._tail if self._overflow else None)

    def _keep(self, data: bytes, start: int, stop: int) -> None:
        room = self.max_line - len(self._partial)
        if stop - start > room:
            if room > 0:
                self._partial += data[start : start + room]
                start += room
            self._overflow = True
            rest = data[max(start, stop - self.tail) : stop]
            self._tail = rest if len(rest) >= self.tail else (self._tail + rest)[-self.tail :]
        elif stop > start:
            self._partial += data[start:stop]


@dataclass(slots=True)
class SseEvent:
    """One dispatched event: its data (``data:`` lines joined with LF) and name."""

    data: bytes
    event: str = ""
    #: Some of its data (or one of its lines) was cut by the bounds.
    truncated: bool = False
    #: When truncated: the end of its last data line (a true suffix of the event's data,
    #: at most ``TAIL`` bytes), where trailing fields such as ``usage`` are.
    tail: bytes = b""


class SseParser:
    """Turns an event stream, fed in arbitrary chunks, into :class:`SseEvent` s."""

    __slots__ = (
        "max_event", "_lines", "_data", "_has_data", "_event", "_truncated", "_last", "_last_tail", "events", "comments",
        "gaps", "_resuming", "_fresh",
    )  # fmt: skip

    def __init__(self, max_event: int = MAX_EVENT, max_line: int = MAX_LINE, tail: int = TAIL) -> None:
        self.max_event = max(1, max_event)
        self._lines = LineSplitter(max_line, tail)
        self._data = bytearray()
        self._has_data = False
        self._event = ""
        self._truncated = False
        self._last = b""  # the last data line's value (kept whole), or its kept prefix when cut
        self._last_tail: bytes | None = None  # the end of the last data line, when it was cut
        #: Events dispatched so far.
        self.events = 0
        #: Comment lines seen (keep-alives such as ``: ping``).
        self.comments = 0
        #: Holes in the stream reported (``gap``): bytes the capture lost.
        self.gaps = 0
        self._resuming = False  # after a gap: lines are dropped until the next blank line
        self._fresh = False  # the next bytes are the first after a gap

    def gap(self) -> None:
        """Bytes of the stream were lost here (a truncated or lost capture). The event in
        progress is dropped, and the stream resumes at the next boundary that can be
        trusted: the bytes after the hole when they begin with a ``data:``/``event:``
        field (the hole ended at a line start), else the line after the next blank line.
        Later events, the final usage chunk among them, are read as usual."""
        self.gaps += 1
        self._data.clear()
        self._has_data = False
        self._event = ""
        self._truncated = False
        self._last, self._last_tail = b"", None
        self._lines.gap(resumes_at_line=True)
        self._resuming = True
        self._fresh = True

    @property
    def buffered(self) -> int:
        """Bytes held for the event and line in progress (bounded)."""
        return len(self._data) + self._lines.buffered + len(self._last) + len(self._last_tail or b"")

    def hand_over(self) -> bytes | None:
        """For a reader of the stream's bytes that takes over from here (protocols/genai/llm.py's
        SseTap): when nothing is in progress but maybe the first line of an event (no data,
        no event name, no line cut or ended by CR, not resuming after a hole), that line's
        bytes so far (b"" for none), forgotten here: feeding them back gives this state
        again. None when the parser holds anything else."""
        lines = self._lines
        if (
            self._has_data or self._event or self._resuming or self._fresh
            or lines._overflow or lines._after_cr or lines._skip_first
        ):  # fmt: skip
            return None
        partial = lines._partial
        if not partial:
            return b""
        held = bytes(partial)
        partial.clear()
        return held

    def feed(self, data: bytes) -> list[SseEvent]:
        out: list[SseEvent] = []
        size = len(data)
        if (
            size > 8
            and not self._has_data
            and not self._resuming
            and data[size - 2 :] == b"\n\n"
            and data.startswith(b"data: ")
            and data.find(b"\n") == size - 2
            and size - 8 <= self.max_event
            and self._lines.idle()
            and data.find(b"\r") < 0
        ):
            # One whole single-line event (how most servers write a stream chunk): what the
            # line layer would make of it, without splitting lines.
            out.append(SseEvent(data[6 : size - 2], self._event))
            self._event = ""
            self.events += 1
            return out
        if self._fresh and data:
            self._fresh = False
            if data.startswith((b"data:", b"event:")):
                self._resuming = False  # the hole ended where an event begins
            else:
                self._lines.gap()  # the first line is the end of a cut one
        for line, tail in self._lines.feed(data):
            if self._resuming:
                if not line and tail is None:
                    self._resuming = False  # a blank line: the next event starts clean
                continue
            self._line(line, tail, out)
        return out

    def _line(self, line: bytes, tail: bytes | None, out: list[SseEvent]) -> None:
        if not line:
            if tail is None:
                self._dispatch(out)
            return
        if line[0] == 0x3A:  # ":" comment
            self.comments += 1
            return
        colon = line.find(b":")
        if colon < 0:
            field, value = line, b""
        else:
            field = line[:colon]
            value = line[colon + 1 :]
            if value[:1] == b" ":
                value = value[1:]
        if field == b"data":
            self._append(value, tail)
        elif field == b"event":
            self._event = value[:MAX_EVENT_NAME].decode("utf-8", "replace")

    def _append(self, value: bytes, tail: bytes | None) -> None:
        self._last, self._last_tail = value, tail
        data = self._data
        if self._has_data:
            value = b"\n" + value
        self._has_data = True
        room = self.max_event - len(data)
        if len(value) > room:
            data += value[: max(room, 0)]
            self._truncated = True
        else:
            data += value
        if tail is not None:
            self._truncated = True

    def _dispatch(self, out: list[SseEvent]) -> None:
        if self._has_data:
            if self._truncated:
                tail = self._last_tail if self._last_tail is not None else self._last[-self._lines.tail :]
                out.append(SseEvent(bytes(self._data), self._event, True, bytes(tail)))
            else:
                out.append(SseEvent(bytes(self._data), self._event))
            self.events += 1
        self._data.clear()
        self._has_data = False
        self._event = ""
        self._truncated = False
        self._last, self._last_tail = b"", None
