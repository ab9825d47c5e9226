"""Incremental HTTP/1.x parser for one direction of one connection.

Sans-IO, in the style of h11: :meth:`HttpParser.feed` takes the bytes one
syscall moved and returns events; it never blocks, never does I/O and never
raises on bad input (malformed input is counted in ``parse_errors``).

Events per message, always in this order:

* :class:`HeadComplete` once the start line and headers are parsed, so the
  stitcher can start an exchange before a long body has crossed the socket;
* :class:`BodyData` for every piece of (de-chunked) body as it arrives, with
  the time of the syscall that moved it: a streamed response (SSE) is seen
  chunk by chunk, its last chunk included, whatever its size; unless a reader
  takes the pieces as the parser frames them (a :class:`BodyTap` on the
  message: an LLM call's SSE stream, read in place), in which case only what it
  leaves comes as BodyData, in order, after what it took;
* :class:`MessageComplete` once the body is over, or once the parser gives up
  on it (``complete=False``). HeadComplete and MessageComplete are always
  paired and carry the *same* message object, whose body fields keep filling
  in between the two.

What to keep of a body is the consumer's decision: the parser only keeps the
first ``body_limit`` bytes on ``message.body`` (the session sets it; 0 keeps none).

Capture is lossy, so the parser also copes with bytes it never sees (the
``missing`` argument of ``feed``) and with bodies that skipped the traced
syscalls entirely (splice): see :meth:`HttpParser.feed`.

Policy when framing is lost (a gap or garbage in a head, a chunk-size line,
the CRLF after chunk data, or a malformed head): count one parse error, end
the current message if its head was already reported (``complete=False``,
``body_truncated=True`` when body bytes were lost: the stitcher can still
close the exchange instead of waiting forever), drop it otherwise, then
discard bytes until a chunk *begins* with a plausible message start.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import Callable, Literal

from protocols.http1.types import FieldBlock, HttpRequest, HttpResponse

try:
    import cython
except ImportError:  # Cython not installed: run as plain Python

    class cython:  # type: ignore[no-redef]  # noqa: N801 - stands in for the module
        compiled = False

HttpMessage = HttpRequest | HttpResponse

MAX_HEAD_SIZE = 64 * 1024
MAX_HEADERS = 256
#: A chunk-size line, extensions included, longer than this is not HTTP.
MAX_CHUNK_LINE = 4096
#: Interim (1xx) statuses remembered per final response; more are not kept.
MAX_INFORMATIONAL = 16

#: RFC 9110 methods, PATCH (RFC 5789) and QUERY: the set the HTTP semantic
#: conventions know (tests check it matches otelbpf.semconv's).
STANDARD_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "QUERY"})
_STANDARD_METHOD_BYTES = frozenset(method.encode() for method in STANDARD_METHODS)
#: The first bytes of the standard methods (HttpParser._may_start).
_METHOD_FIRST_BYTES = bytes(sorted({method.encode()[0] for method in STANDARD_METHODS}))

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]"  # RFC 9110 tchar
_TARGET_CHAR = rb"[^\x00-\x20\x7f]"  # lenient: raw UTF-8 in targets is common

# Parsing a complete head (decoded latin-1).
_REQUEST_LINE = re.compile(rf"({_TOKEN.decode()}+) ({_TARGET_CHAR.decode()}+) HTTP/(1\.\d)")
_STATUS_LINE = re.compile(r"HTTP/(1\.\d) ([1-9]\d\d)(?: (.*))?")
_HEX_DIGITS = b"0123456789abcdefABCDEF"

# Does a chunk begin a message? Only the first _START_WINDOW bytes are looked
# at; the target may run past them or past the chunk's end (capture size).
_START_WINDOW = 8192
_REQUEST_START = re.compile(
    b"(" + _TOKEN + rb"{1,32}) " + _TARGET_CHAR + rb"+(?P<version> HTTP/1\.\d(?:\r\n|\r?\Z))?"
)
_RESPONSE_START = re.compile(rb"HTTP/1\.\d [1-9]\d\d(?: |\r\n|\r?\Z)")


def _any_prefix_of(*steps: bytes) -> re.Pattern[bytes]:
    """Regex matching exactly the non-empty prefixes of what ``steps``, in sequence, match."""
    pattern = b""
    for step in reversed(steps):
        pattern = step + (b"(?:" + pattern + b")?" if pattern else b"")
    return re.compile(pattern + rb"\Z")


def _literal_steps(literal: bytes) -> list[bytes]:
    return [re.escape(bytes([byte])) for byte in literal]


# Is a partial head still just the beginning of a start line? Then a chunk
# that looks like a message start continues it rather than replacing it.
_REQUEST_LINE_PREFIX = _any_prefix_of(
    _TOKEN + rb"{1,32}", b" ", _TARGET_CHAR + b"*", *_literal_steps(b" HTTP/1."), rb"\d", rb"\r"
)
_STATUS_LINE_PREFIX = _any_prefix_of(*_literal_steps(b"HTTP/1."), rb"\d", b" ", rb"[1-9]", rb"\d", rb"\d", rb"[^\n]*")


def looks_like_request_start(data: bytes) -> bool:
    """True if ``data`` begins with ``METHOD SP target SP HTTP/1.x``.

    The version may be missing only when the chunk ends inside the target
    and the method is a standard one (a long URL cut by the capture size).
    """
    start = _request_start(data)
    return start is not None and (start[1] or start[0] in _STANDARD_METHOD_BYTES)


def _looks_like_standard_request_start(data: bytes) -> bool:
    """Like :func:`looks_like_request_start`, for standard methods only.

    Used where a false positive costs a message: any token method would
    accept a body's last bytes glued to the next request (``b"*GET / ..."``).
    """
    start = _request_start(data)
    return start is not None and start[0] in _STANDARD_METHOD_BYTES


def _request_start(data: bytes) -> tuple[bytes, bool] | None:
    """(method, whether `` HTTP/1.x`` was seen) if ``data`` begins like a request line."""
    match = _REQUEST_START.match(data, 0, _START_WINDOW)
    if match is None:
        return None
    has_version = match.group("version") is not None
    if not has_version and match.end() != min(len(data), _START_WINDOW):
        return None
    return match.group(1), has_version


def looks_like_response_start(data: bytes) -> bool:
    """True if ``data`` begins with a status line ``HTTP/1.x NNN``."""
    return _RESPONSE_START.match(data) is not None


@dataclass
class HeadComplete:
    """A message's start line and headers are parsed; its body may follow."""

    __slots__ = ("message",)
    message: HttpMessage

    def __init__(self, message) -> None:
        self.message = message


@dataclass
class BodyData:
    """Body bytes of ``message`` (de-chunked), moved by a syscall at ``ts_ns``.

    ``data`` None marks a hole (only while ``body_events`` is on): body bytes the
    capture lost here, so that a reader of the pieces (an SSE stream) resumes at its
    next boundary instead of joining the bytes on both sides of it."""

    __slots__ = ("message", "data", "ts_ns")
    message: HttpMessage
    data: bytes
    ts_ns: int

    def __init__(self, message, data, ts_ns) -> None:
        self.message = message
        self.data = data
        self.ts_ns = ts_ns


@dataclass
class MessageComplete:
    """A message is over: body done, or abandoned (``message.complete`` False)."""

    __slots__ = ("message",)
    message: HttpMessage

    def __init__(self, message) -> None:
        self.message = message


ParserEvent = HeadComplete | BodyData | MessageComplete


class BodyTap:
    """A reader of a body's pieces that the parser hands them to as it frames them,
    instead of making a :class:`BodyData` event per piece (an LLM call's SSE stream,
    counted from its bytes: protocols/genai/chunks.py's SseTap). Set on
    ``message.body_tap`` by the body's reader, from outside the parser, or given for a
    response before its head comes (:meth:`HttpParser.expect_response_to`).

    The parser calls :meth:`take` with each piece of the body (de-chunked), in order.
    The tap takes a prefix of it; the parser reports the rest as BodyData, as usual,
    after what :meth:`release` gives back, and detaches the tap (``message.body_tap``
    None): from then on every piece of that body is BodyData again, so the reader sees
    the stream in order, the tap's part first. The parser also releases the tap before
    anything else it tells about the body (a hole, its end, lost framing). This base
    class takes nothing."""

    def begin(self, message: HttpMessage) -> None:
        """The parser hands this tap the body of ``message``, whose head was just parsed
        (a tap given with :meth:`HttpParser.expect_response_to`)."""

    def take(self, data: bytes, start: int, stop: int, ts_ns: int) -> int:
        """Take ``data[start:stop]``, moved at ``ts_ns``: return where what it took ends
        (``stop``: all of it; ``start``: none, and the tap is done). A tap may hold the
        end of what it takes (an unfinished event) until a later piece completes it."""
        return start

    def release(self) -> tuple[bytes, int] | None:
        """The tap is done: the bytes it holds (taken, not read yet) with their time, for
        the parser to report as BodyData, or None."""
        return None


# Parser states: plain ints, declared C ints in parse.pxd, so that the compiled
# parser tests and dispatches on a C int; the pure module runs the same code.
_HEAD = 0  # between messages, or inside a head (bytes kept in the buffer)
_FIXED_BODY = 1  # Content-Length body; _remaining bytes to go
_CHUNK_SIZE = 2  # reading a chunk-size line
_CHUNK_DATA = 3  # _remaining bytes of chunk data to go
_CHUNK_DATA_END = 4  # the CRLF after chunk data; _remaining of its 2 bytes to go
_TRAILERS = 5  # trailer section after the last chunk
_UNTIL_CLOSE = 6  # response body delimited by connection close
_RESYNC = 7  # framing lost: discard until a chunk begins with a message start
_OPAQUE = 8  # after 101 Switching Protocols or a CONNECT tunnel: not HTTP/1 any more
_CHUNK_RESYNC = 9  # chunked body whose pieces are read (body_events) lost its framing: find the next chunk

#: A chunk boundary to resume at after a gap: the CRLF ending some chunk's data, then a chunk-size line.
_CHUNK_BOUNDARY = re.compile(rb"\r\n([0-9a-fA-F]{1,8})(?:;[^\r\n]{0,256})?\r\n")
#: The same at the start of the bytes after a gap (a read that began with a chunk).
_CHUNK_LINE_AT = re.compile(rb"([0-9a-fA-F]{1,8})(?:;[^\r\n]{0,256})?\r\n")
#: Bytes kept across reads while looking for a boundary (one may straddle two reads).
_RESYNC_CARRY = 280
#: Bytes searched for a boundary before giving up on the message (then as any lost framing).
MAX_CHUNK_RESYNC = 1 << 20


# How a body is delimited (ints, C ints when compiled, like the states).
_NO_FRAMING = 0  # neither Content-Length nor Transfer-Encoding
_LENGTH = 1
_CHUNKED = 2
_OTHER_CODING = 3  # Transfer-Encoding whose last coding is not chunked
_INVALID = 4  # unparsable or conflicting Content-Length


class HttpParser:
    """Turns one direction's byte stream into HTTP requests or responses.

    ``kind`` says which: a request parser never sees responses and vice
    versa. Every captured body byte is reported as :class:`BodyData` (unless
    ``body_events`` is off: a consumer that reads no body pieces saves a copy
    and an event per piece; or the message has a :class:`BodyTap`, which takes
    the pieces it reads in place); at most
    ``body_limit`` bytes of each body are also kept on ``message.body``
    (a convenience for consumers that want a prefix); ``body_size`` counts
    them all. Memory stays bounded whatever the input:
    heads over ``max_head_size`` or with more than ``max_headers`` fields are
    parse errors, and the response parser remembers at most ``max_pending``
    request methods.
    """

    def __init__(
        self,
        kind: Literal["request", "response"],
        body_limit: int = 65536,
        *,
        max_head_size: int = MAX_HEAD_SIZE,
        max_headers: int = MAX_HEADERS,
        max_pending: int = 256,
        body_events: bool = True,
    ) -> None:
        if kind not in ("request", "response"):
            raise ValueError(f"kind must be 'request' or 'response', not {kind!r}")
        self.kind = kind
        self.body_limit = body_limit
        self.body_events = body_events
        self.max_head_size = max_head_size
        self.max_headers = max_headers
        #: Count of malformed or unparsable inputs skipped.
        self.parse_errors = 0
        #: Chunked bodies resumed at a later chunk after a gap or lost framing (body_events only).
        self.resyncs = 0
        self._resync_scanned = 0
        self._resync_fresh = False  # the next bytes follow a gap: a chunk may start right there
        self._is_request = kind == "request"
        self._looks_like_start: Callable[[bytes], bool] = (
            looks_like_request_start if self._is_request else looks_like_response_start
        )
        self._looks_like_restart: Callable[[bytes], bool] = (
            _looks_like_standard_request_start if self._is_request else looks_like_response_start
        )
        self._start_line_prefix = _REQUEST_LINE_PREFIX if self._is_request else _STATUS_LINE_PREFIX
        self._state = _HEAD
        self._buffer = bytearray()  # partial head, chunk-size line or trailers
        self._message: HttpMessage | None = None  # set while its body is being read
        self._head_start_ns = 0
        self._last_byte_ns = 0  # ts of the chunk holding the current message's latest byte
        self._remaining = 0
        self._body_parts: list[bytes] = []
        self._captured = 0
        self._informational: list[int] = []
        self._expected_methods: deque[str] = deque(maxlen=max_pending)
        self._expected_taps: deque[BodyTap | None] = deque(maxlen=max_pending)  # in step with the methods

    @property
    def opaque(self) -> bool:
        """The stream stopped being HTTP/1 (101 Switching Protocols, CONNECT tunnel)."""
        return self._state == _OPAQUE

    @property
    def buffered_bytes(self) -> int:
        """Bytes held for the message in progress (partial head plus captured body)."""
        return len(self._buffer) + self._captured

    def at_rest(self) -> bool:
        """Between messages with nothing carried over: no message in progress, no
        partial head or chunk line buffered, no 1xx response waiting for its
        final one, no response method expected, framing intact. A session in this
        state can be replaced by a fresh one (otelbpf/fastpath hands connections
        back and forth at such points)."""
        return (
            self._state == _HEAD
            and self._message is None
            and not self._buffer
            and not self._informational
            and not self._expected_methods
            and not self._expected_taps
        )

    def adopt_fixed_body(
        self, message: HttpMessage, remaining: int, parts: list[bytes], head_start_ns: int, last_byte_ns: int
    ) -> None:
        """Continue a message whose head and first body bytes were parsed elsewhere, as if
        this parser had read them: ``remaining`` bytes of its ``Content-Length`` body are
        still to come, ``parts`` holds what was kept of the body so far (``body_limit``),
        ``last_byte_ns`` stamps the newest byte read. Only on a parser at rest
        (:meth:`at_rest`), with the response's expected method already consumed. For a
        session taking a connection over from the compiled fast path (otelbpf/fastpath)
        in the middle of a body."""
        self._message = message
        self._state = _FIXED_BODY
        self._remaining = remaining
        self._body_parts = parts
        self._captured = sum(len(part) for part in parts)
        self._head_start_ns = head_start_ns
        self._last_byte_ns = last_byte_ns

    def expect_response_to(self, method: str, tap: BodyTap | None = None) -> None:
        """Tell a response parser that a request with ``method`` was sent.

        Final responses answer requests in order; the method decides their
        framing (HEAD: no body; CONNECT + 2xx: tunnel). A response that
        arrives with no method queued is framed as if it answered a GET.
        When more than ``max_pending`` are queued the oldest is forgotten,
        as the stitcher evicts the oldest outstanding request.

        ``tap``: a reader for that response's body, set on the response
        (``body_tap``) as its head is parsed, so that it takes the body from
        its first byte (see :class:`BodyTap`).
        """
        self._expected_methods.append(method)
        self._expected_taps.append(tap)

    def feed(self, data: bytes, ts_ns: int, missing: int = 0) -> list[ParserEvent]:
        """Parse ``data`` (one syscall's bytes, moved at ``ts_ns``).

        ``missing`` bytes followed ``data`` but were not captured. Inside a
        body they only advance its counters (``body_truncated``); anywhere
        else they break framing (see the module docstring).

        A chunk that begins with a message start (for requests: a standard
        method) while a message is still in progress means the rest of that
        message was never captured, and the new one is parsed:

        * inside a body, its tail skipped the traced syscalls (splice): the
          message ends with ``complete=False`` and ``body_truncated=True``;
        * inside a head whose start line is complete or can no longer become
          one (say, the capture began mid-stream), the partial head is
          dropped and counted as a parse error.

        This is checked at chunk boundaries only, where an unrelated body
        rarely lines up with a start line.
        """
        events: list[ParserEvent] = []
        if self._state == _OPAQUE:
            return events
        if data:
            if self._state == _RESYNC:
                if not self._looks_like_start(data):
                    return events
                self._state = _HEAD
            elif self._cut_short_by(data):
                self._drop_message_in_progress(events)
            self._consume(data, ts_ns, events)
        if missing > 0:
            self._skip_missing(missing, ts_ns, events)
        return events

    def close(self) -> list[ParserEvent]:
        """The connection ended: finish or abandon the message in progress.

        A body delimited by the close completes normally; any other message
        whose head was reported ends with ``complete=False``; a partial head
        is dropped and counted as a parse error.
        """
        events: list[ParserEvent] = []
        if self._state == _UNTIL_CLOSE:
            self._finish(self._last_byte_ns, events)
        elif self._message is not None:
            self._abandon_message(events, body_lost=False)
        elif self._state == _HEAD and self._buffer:
            self.parse_errors += 1
            self._buffer.clear()
        return events

    # -- byte consumption -------------------------------------------------

    def _consume(self, data: bytes, ts_ns: int, events: list[ParserEvent]) -> None:
        pos, end = 0, len(data)
        while pos < end:
            state = self._state
            if state == _HEAD:
                pos = self._consume_head(data, pos, ts_ns, events)
            elif state == _FIXED_BODY:
                pos = self._consume_fixed_body(data, pos, ts_ns, events)
            elif state == _CHUNK_SIZE:
                pos = self._consume_chunk_size(data, pos, ts_ns, events)
            elif state == _CHUNK_DATA:
                pos = self._consume_chunk_data(data, pos, ts_ns, events)
            elif state == _CHUNK_DATA_END:
                pos = self._consume_chunk_data_end(data, pos, ts_ns, events)
            elif state == _TRAILERS:
                pos = self._consume_trailers(data, pos, ts_ns, events)
            elif state == _UNTIL_CLOSE:
                pos = self._consume_until_close(data, pos, ts_ns, events)
            elif state == _CHUNK_RESYNC:
                pos = self._consume_chunk_resync(data, pos, ts_ns, events)
            else:  # RESYNC or OPAQUE: the rest of this chunk is ignored
                return
            if self._message is not None:  # what was just consumed belongs to it
                self._last_byte_ns = ts_ns

    def _consume_head(self, data: bytes, pos: int, ts_ns: int, events: list[ParserEvent]) -> int:
        if not self._buffer:
            pos = _skip_blank_lines(data, pos)
            if pos == len(data):
                return pos
            self._head_start_ns = ts_ns
        head, pos = self._take_section(data, pos, b"\r\n\r\n", self.max_head_size, events)
        if head is not None:
            self._on_head(head, ts_ns, events)
        return pos

    def _consume_fixed_body(self, data: bytes, pos: int, ts_ns: int, events: list[ParserEvent]) -> int:
        count = min(len(data) - pos, self._remaining)
        self._take_body(data, pos, count, ts_ns, events)
        if self._remaining == 0:
            self._finish(ts_ns, events)
        return pos + count

    def _consume_chunk_size(self, data: bytes, pos: int, ts_ns: int, events: list[ParserEvent]) -> int:
        if not self._buffer and type(data) is bytes:
            after = self._consume_chunk_size_fast(data, pos, ts_ns, events)
            if after >= 0:
                return after
        line, pos = self._take_section(data, pos, b"\r\n", MAX_CHUNK_LINE, events)
        if line is None:
            return pos
        size = _chunk_size(line)
        if size is None:
            if self.body_events:
                self._chunk_resync(ts_ns, events, False)
            else:
                self._lose_sync(events)
        elif size == 0:
            # Seed the buffer with the last-chunk line's CRLF so that the
            # trailer section, empty or not, ends at the first CRLFCRLF.
            self._buffer += b"\r\n"
            self._state = _TRAILERS
        else:
            self._remaining = size
            self._state = _CHUNK_DATA
        return pos

    def _consume_chunk_size_fast(self, data: bytes, pos: int, ts_ns: int, events: list[ParserEvent]) -> int:
        """The common shape, read in place: 1-8 hex digits and CRLF, then (a streamed
        response writes a chunk at a time) the chunk's data and its CRLF, all in ``data``.
        Returns where the parse goes on, or -1: not that shape, the general path reads it."""
        after = self._short_chunk_line(data, pos)
        if after == 0:
            return -1
        size = self._remaining
        end = after + size
        if end + 2 <= len(data) and data[end] == 0x0D and data[end + 1] == 0x0A:
            self._take_body(data, after, size, ts_ns, events)  # _remaining back to 0
            return end + 2  # the next chunk-size line
        self._state = _CHUNK_DATA  # its data runs past these bytes (or lacks its CRLF: found there)
        return after

    def _short_chunk_line(self, data: bytes, pos: int) -> int:
        """Where the chunk's data starts when ``data`` holds, at ``pos``, a chunk-size line
        of 1 to 8 hex digits and its CRLF (no extension, no blank) for a chunk that is not
        the last; its size is then set in ``_remaining``. 0 for any other line, or one not
        all in ``data``: the general path (_take_section, _chunk_size) reads those, to the
        same result."""
        end = len(data)
        limit = pos + 8 if pos + 8 < end else end
        size = 0
        i = pos
        while i < limit:
            c = data[i]
            if 0x30 <= c <= 0x39:
                size = size * 16 + (c - 0x30)
            elif 0x61 <= c <= 0x66:
                size = size * 16 + (c - 0x57)
            elif 0x41 <= c <= 0x46:
                size = size * 16 + (c - 0x37)
            else:
                break
            i += 1
        if i == pos or size == 0 or i + 2 > end or data[i] != 0x0D or data[i + 1] != 0x0A:
            return 0
        self._remaining = size
        return i + 2

    def _consume_chunk_data(self, data: bytes, pos: int, ts_ns: int, events: list[ParserEvent]) -> int:
        count = min(len(data) - pos, self._remaining)
        self._take_body(data, pos, count, ts_ns, events)
        if self._remaining == 0:
            self._remaining = 2
            self._state = _CHUNK_DATA_END
        return pos + count

    def _consume_chunk_data_end(self, data: bytes, pos: int, ts_ns: int, events: list[ParserEvent]) -> int:
        expected = b"\r\n"[2 - self._remaining :]
        seen = data[pos : pos + len(expected)]
        if not expected.startswith(seen):
            if self.body_events:
                self._chunk_resync(ts_ns, events, False)
            else:
                self._lose_sync(events)
            return pos
        self._remaining -= len(seen)
        if self._remaining == 0:
            self._state = _CHUNK_SIZE
        return pos + len(seen)

    def _consume_chunk_resync(self, data: bytes, pos: int, ts_ns: int, events: list[ParserEvent]) -> int:
        """Look for the next chunk boundary that can be trusted: a CRLF then a chunk-size
        line (or such a line right where the bytes after a gap begin) whose chunk ends
        with its CRLF where that is in view; resume the body there. What lies before it
        was framing and body both, lost."""
        carry = self._buffer
        if carry:
            text = bytes(carry) + data[pos:]
            carried = len(carry)
            carry.clear()
        else:
            text = data[pos:] if pos else data
            carried = 0
        size = len(text)
        found = -1
        after = 0
        chunk = 0
        if self._resync_fresh and not carried:
            self._resync_fresh = False
            match = _CHUNK_LINE_AT.match(text)
            if match is not None:
                chunk = int(match.group(1), 16)
                after = match.end()
                if _chunk_end_fits(text, after, chunk, size):
                    found = 0
        if found < 0:
            self._resync_fresh = False
            search = 0
            while True:
                match = _CHUNK_BOUNDARY.search(text, search)
                if match is None:
                    break
                chunk = int(match.group(1), 16)
                after = match.end()
                if _chunk_end_fits(text, after, chunk, size):
                    found = match.start()
                    break
                search = match.start() + 2
        if found < 0:
            self._resync_scanned += size - carried
            if self._resync_scanned > MAX_CHUNK_RESYNC:
                self._lose_sync(events)
                return len(data)
            keep = text[-_RESYNC_CARRY:] if size > _RESYNC_CARRY else text
            carry += keep
            return len(data)
        self.resyncs += 1
        self._resync_scanned = 0
        consumed = pos + after - carried  # where the chunk's data begins in data
        if chunk == 0:
            self._buffer += b"\r\n"  # as _consume_chunk_size: the trailers end at CRLFCRLF
            self._state = _TRAILERS
        else:
            self._remaining = chunk
            self._state = _CHUNK_DATA
        if consumed < pos:  # the boundary was in the carried bytes: its data starts in them
            head = text[after : carried]
            self._consume_carried(head, ts_ns, events)
            return pos
        return consumed

    def _consume_carried(self, head: bytes, ts_ns: int, events: list[ParserEvent]) -> None:
        """Bytes of the carry that follow the boundary found: parsed before the new ones."""
        if head:
            self._consume(head, ts_ns, events)

    def _chunk_resync(self, ts_ns: int, events: list[ParserEvent], after_gap: bool) -> None:
        """Chunked framing was lost inside a body whose pieces are read: keep the message
        (marked truncated), tell the body's reader its bytes have a hole (BodyData with
        data None), and resume at the next chunk boundary (_consume_chunk_resync)."""
        message = self._message
        assert message is not None
        self._release_tap(message, events)
        message.body_truncated = True
        events.append(BodyData(message, None, ts_ns))
        self._buffer.clear()
        self._resync_scanned = 0
        self._resync_fresh = after_gap
        self._state = _CHUNK_RESYNC

    def _consume_trailers(self, data: bytes, pos: int, ts_ns: int, events: list[ParserEvent]) -> int:
        section, pos = self._take_section(data, pos, b"\r\n\r\n", self.max_head_size, events)
        if section is not None:
            assert self._message is not None
            # The section starts with the seeded CRLF: line 0 is always empty.
            self._message.trailers = self._parse_fields(section.decode("latin-1").split("\r\n")[1:])
            self._finish(ts_ns, events)
        return pos

    def _consume_until_close(self, data: bytes, pos: int, ts_ns: int, events: list[ParserEvent]) -> int:
        self._take_body(data, pos, len(data) - pos, ts_ns, events)
        return len(data)

    def _take_section(
        self, data: bytes, pos: int, terminator: bytes, limit: int, events: list[ParserEvent]
    ) -> tuple[bytes | None, int]:
        """Bytes up to ``terminator``, joined with what earlier chunks left.

        Returns ``(section, position after the terminator)``, or ``(None,
        len(data))`` once the rest of ``data`` is buffered awaiting more.
        A section longer than ``limit`` loses sync.
        """
        buffer = self._buffer
        if buffer:
            search_from = max(0, len(buffer) - len(terminator) + 1)
            already_buffered = len(buffer)
            buffer += data[pos:]
            found = buffer.find(terminator, search_from)
            if found < 0:
                section = None
            else:
                section = bytes(buffer[:found])
                buffer.clear()
                pos += found + len(terminator) - already_buffered
        else:
            found = data.find(terminator, pos)
            if found < 0:
                buffer += data[pos:]
                section = None
            else:
                section = data[pos:found]
                pos = found + len(terminator)
        if len(buffer) > limit or (section is not None and len(section) > limit):
            self._lose_sync(events)
            return None, len(data)
        return section, pos if section is not None else len(data)

    def _take_body(self, data: bytes, pos: int, count: int, ts_ns: int, events: list[ParserEvent]) -> None:
        message = self._message
        assert message is not None
        if count <= 0:
            return
        room = self.body_limit - self._captured
        part = None
        if self.body_events:
            start = pos
            if message.body_tap is not None:
                tap = message.body_tap
                if type(data) is bytes:
                    start = tap.take(data, pos, pos + count, ts_ns)
                if start < pos + count:  # the tap is done: what it holds, then the rest, as BodyData
                    self._release_tap(message, events)
            if start < pos + count:
                part = data[start : pos + count] if start or count != len(data) else data
                events.append(BodyData(message, part, ts_ns))
                if start != pos:
                    part = None
        if room > 0:
            if part is None:
                part = data[pos : pos + count] if pos or count != len(data) else data
            kept = part if count <= room else part[:room]
            self._body_parts.append(kept)
            self._captured += len(kept)
        message.body_size += count
        self._remaining -= count

    def _release_tap(self, message: HttpMessage, events: list[ParserEvent]) -> None:
        """Detach ``message``'s body tap, if any; report what it held (BodyData) first."""
        tap = message.body_tap
        if tap is not None:
            message.body_tap = None
            held = tap.release()
            if held is not None:
                events.append(BodyData(message, held[0], held[1]))

    # -- heads --------------------------------------------------------------

    def _on_head(self, head: bytes, ts_ns: int, events: list[ParserEvent]) -> None:
        text = head.decode("latin-1")
        if text.count("\r\n") > self.max_headers:
            self._lose_sync(events)
            return
        end_of_start = text.find("\r\n")
        start_line = text if end_of_start < 0 else text[:end_of_start]
        message = _new_request(start_line) if self._is_request else _new_response(start_line)
        if message is None:
            self._lose_sync(events)
            return
        if end_of_start >= 0:
            message.headers = self._fields(text, end_of_start + 2)
        message.start_ns = self._head_start_ns
        message.head_end_ns = ts_ns
        if isinstance(message, HttpRequest):
            self._frame_request(message, events)
        else:
            self._frame_response(message, events)

    def _fields(self, text: str, first: int) -> FieldBlock | list[tuple[str, str]]:
        """The head's fields from ``first`` on: a :class:`FieldBlock` (split into
        pairs only if a consumer walks them) when every line is a well-formed
        ``name:value``; otherwise the pairs, parsed now so that bad lines are
        counted and folded lines joined."""
        size = len(text)
        start = first
        content_length: str | None = None
        transfer_coding: str | None = None
        while True:
            end = text.find("\r\n", start)
            if end < 0:
                end = size
            colon = text.find(":", start, end)
            if colon <= start or text[start] == " " or text[start] == "\t":
                return self._parse_fields(text[first:].split("\r\n"))
            name_size = colon - start
            if name_size == 14 or name_size == 17:  # len("content-length"), len("transfer-encoding")
                name = text[start:colon].lower()
                if name == "content-length":
                    content_length = _joined(content_length, text[colon + 1 : end].strip())
                elif name == "transfer-encoding":
                    transfer_coding = _joined(transfer_coding, text[colon + 1 : end].strip())
            if end == size:
                return FieldBlock(text, first, content_length, transfer_coding)
            start = end + 2

    def _parse_fields(self, lines: list[str]) -> list[tuple[str, str]]:
        """``name: value`` lines to pairs; bad lines are counted and skipped."""
        fields: list[tuple[str, str]] = []
        for line in lines:
            name, colon, value = line.partition(":")
            if colon and name and name[0] not in " \t":
                fields.append((name.lower(), value.strip()))
            elif line[:1] in (" ", "\t") and fields:  # obsolete line folding
                folded_name, previous = fields[-1]
                fields[-1] = (folded_name, f"{previous} {line.strip()}")
            else:
                self.parse_errors += 1
        return fields

    def _frame_request(self, request: HttpRequest, events: list[ParserEvent]) -> None:
        framing, length = _body_framing(request.headers)
        if framing == _INVALID or framing == _OTHER_CODING:
            self._lose_sync(events)  # a server answers 400 and closes: nothing to frame by
            return
        self._begin_body(request, framing, length, events)

    def _frame_response(self, response: HttpResponse, events: list[ParserEvent]) -> None:
        status = response.status
        if status < 200 and status != 101:
            if len(self._informational) < MAX_INFORMATIONAL:
                self._informational.append(status)
            return
        method = self._expected_methods[0] if self._expected_methods else None
        if status == 101 or (method == "CONNECT" and 200 <= status < 300):
            self._begin_body(response, _LENGTH, 0, events)
            self._state = _OPAQUE
        elif method == "HEAD" or status == 204 or status == 304:
            self._begin_body(response, _LENGTH, 0, events)
        else:
            framing, length = _body_framing(response.headers)
            if framing == _INVALID:
                self._lose_sync(events)
                return
            self._begin_body(response, framing, length, events)

    def _begin_body(self, message: HttpMessage, framing: int, length: int, events: list[ParserEvent]) -> None:
        """Report the head, then set up for the body (or finish if it has none)."""
        tap = None
        if isinstance(message, HttpResponse):
            if self._expected_methods:
                self._expected_methods.popleft()
                tap = self._expected_taps.popleft()
            message.informational = self._informational
            self._informational = []
        self._message = message
        events.append(HeadComplete(message))
        if tap is not None:
            message.body_tap = tap
            tap.begin(message)
        if framing == _CHUNKED:
            self._state = _CHUNK_SIZE
        elif framing == _LENGTH and length > 0:
            self._remaining = length
            self._state = _FIXED_BODY
        elif self._is_request or framing == _LENGTH:
            self._finish(message.head_end_ns, events)
        else:
            self._state = _UNTIL_CLOSE

    # -- ends of messages -------------------------------------------------

    def _finish(self, end_ns: int, events: list[ParserEvent]) -> None:
        message = self._message
        assert message is not None
        self._release_tap(message, events)
        message.end_ns = end_ns
        if self._body_parts:
            message.body = b"".join(self._body_parts)
            self._body_parts = []
        self._captured = 0
        self._message = None
        self._state = _HEAD
        events.append(MessageComplete(message))

    def _cut_short_by(self, data: bytes) -> bool:
        """Does ``data``, starting a new message, show the one in progress will never end?"""
        if self._message is None and not self._buffer:
            return False
        if type(data) is bytes and not self._may_start(data):
            return False  # most chunks: their first byte cannot begin a start line (no regex run)
        if not self._looks_like_restart(data):
            return False
        # A start line may be split anywhere: b"G" then b"ET / HTTP/1.1" is one request.
        return self._message is not None or self._start_line_prefix.match(self._buffer) is None

    def _may_start(self, data: bytes) -> bool:
        """Can ``data``'s first byte begin what ``_looks_like_restart`` looks for: ``HTTP/``
        (responses), or a standard method's first letter (requests)?"""
        if not data:
            return False
        first = data[0]
        if not self._is_request:
            return first == 0x48  # H
        return first in _METHOD_FIRST_BYTES

    def _drop_message_in_progress(self, events: list[ParserEvent]) -> None:
        if self._message is not None:
            self._abandon_message(events)
        else:
            self.parse_errors += 1
            self._buffer.clear()

    def _abandon_message(self, events: list[ParserEvent], body_lost: bool = True) -> None:
        """End the message in progress as incomplete (its head was reported)."""
        message = self._message
        assert message is not None
        message.complete = False
        message.body_truncated |= body_lost
        self._buffer.clear()
        self._finish(self._last_byte_ns, events)

    def _lose_sync(self, events: list[ParserEvent]) -> None:
        self.parse_errors += 1
        if self._message is not None:
            self._abandon_message(events, body_lost=self._state != _TRAILERS)
        self._buffer.clear()
        self._informational = []
        self._state = _RESYNC

    def _skip_missing(self, missing: int, ts_ns: int, events: list[ParserEvent]) -> None:
        """Account for ``missing`` uncaptured bytes that followed the last chunk."""
        state = self._state
        if state == _RESYNC or state == _OPAQUE:
            return
        if state == _CHUNK_RESYNC:
            self._buffer.clear()  # a boundary cannot straddle the hole
            self._resync_fresh = True
            return
        gap = self.body_events and self._message is not None
        if gap and self._message.body_tap is not None:
            self._release_tap(self._message, events)
        if state == _UNTIL_CLOSE:
            self._skip_body(missing, ts_ns)
            if gap:
                events.append(BodyData(self._message, None, ts_ns))
            return
        if state == _FIXED_BODY or state == _CHUNK_DATA:
            skipped = min(missing, self._remaining)
            self._skip_body(skipped, ts_ns)
            missing -= skipped
            if gap and (skipped or missing):
                events.append(BodyData(self._message, None, ts_ns))
                gap = False  # told once
            if self._remaining == 0:
                if state == _FIXED_BODY:
                    self._finish(ts_ns, events)
                else:
                    self._remaining = 2
                    self._state = _CHUNK_DATA_END
        if missing > 0:  # the gap covers framing or a head: where the stream resumes is unknown
            state = self._state
            if self.body_events and self._message is not None and (
                state == _CHUNK_SIZE or state == _CHUNK_DATA_END or state == _CHUNK_DATA
            ):
                if gap:
                    self._chunk_resync(ts_ns, events, True)
                else:  # the reader was told of the hole above
                    self._message.body_truncated = True
                    self._buffer.clear()
                    self._resync_scanned = 0
                    self._resync_fresh = True
                    self._state = _CHUNK_RESYNC
            else:
                self._lose_sync(events)

    def _skip_body(self, count: int, ts_ns: int) -> None:
        message = self._message
        assert message is not None
        message.body_size += count
        message.body_truncated = True
        self._remaining -= count
        self._last_byte_ns = ts_ns


def _skip_blank_lines(data: bytes, pos: int) -> int:
    """Skip CR/LF bytes between messages (RFC 9112 §2.2 allows stray CRLFs)."""
    end = len(data)
    while pos < end and data[pos] in b"\r\n":
        pos += 1
    return pos


def _new_request(start_line: str) -> HttpRequest | None:
    parsed = _REQUEST_LINES.get(start_line)
    if parsed is None:
        parsed = _remember(_REQUEST_LINES, start_line, _request_line(start_line))
        if parsed is None:
            return None
    return HttpRequest(version=parsed[2], method=parsed[0], target=parsed[1])


def _new_response(start_line: str) -> HttpResponse | None:
    parsed = _STATUS_LINES.get(start_line)
    if parsed is None:
        parsed = _remember(_STATUS_LINES, start_line, _status_line(start_line))
        if parsed is None:
            return None
    return HttpResponse(version=parsed[0], status=parsed[1], reason=parsed[2])


# Start lines already checked, and what they hold: a connection repeats the
# same few request lines and status lines, and a look-up costs less than the
# checks. Bounded: at most _START_LINES_KEPT of each, forgotten all at once
# when full, none longer than _START_LINE_KEPT_LEN.
_REQUEST_LINES: dict[str, tuple[str, str, str]] = {}
_STATUS_LINES: dict[str, tuple[str, int, str]] = {}
_START_LINES_KEPT = 1024
_START_LINE_KEPT_LEN = 256


def _remember(lines: dict, start_line: str, parsed: tuple | None) -> tuple | None:
    """``parsed``, kept for ``start_line`` unless None (an invalid line is not kept)."""
    if parsed is not None and len(start_line) <= _START_LINE_KEPT_LEN:
        if len(lines) >= _START_LINES_KEPT:
            lines.clear()
        lines[start_line] = parsed
    return parsed


def _request_line(start_line: str) -> tuple[str, str, str] | None:
    """(method, target, version) of a valid request line, else None."""
    parts = start_line.split(" ")
    if len(parts) == 3:  # the common shape, checked without the regex
        method, target, version = parts
        if method in STANDARD_METHODS and _is_version(version) and target and target.isprintable():
            # isprintable: no control character, DEL or space, as _TARGET_CHAR requires
            return method, target, version[5:]
    match = _REQUEST_LINE.fullmatch(start_line)
    if match is None:
        return None
    method, target, version = match.groups()
    return method, target, version


def _status_line(start_line: str) -> tuple[str, int, str] | None:
    """(version, status, reason) of a valid status line, else None."""
    size = len(start_line)
    if (
        size >= 12
        and _is_version(start_line[:8])
        and start_line[8] == " "
        and start_line[9] in _NONZERO_DIGITS
        and start_line[10] in _DIGITS
        and start_line[11] in _DIGITS
        and (size == 12 or (start_line[12] == " " and "\n" not in start_line))
    ):  # the common shape, checked without the regex
        return start_line[5:8], int(start_line[9:12]), start_line[13:].strip()
    match = _STATUS_LINE.fullmatch(start_line)
    if match is None:
        return None
    version, status, reason = match.groups()
    return version, int(status), (reason or "").strip()


_DIGITS = "0123456789"
_NONZERO_DIGITS = "123456789"


def _is_version(text: str) -> bool:
    """``HTTP/1.x`` (x one digit), as the start-line regexes accept it (latin-1 has no other digits)."""
    return len(text) == 8 and text.startswith("HTTP/1.") and text[7] in _DIGITS


def _body_framing(headers: FieldBlock | list[tuple[str, str]]) -> tuple[int, int]:
    """How the body is delimited, per RFC 9112 §6.3 (Transfer-Encoding wins)."""
    content_length: str | None = None
    transfer_coding: str | None = None
    if type(headers) is FieldBlock:  # found while the parser checked the lines
        block: FieldBlock = headers
        content_length = block.content_length
        transfer_coding = block.transfer_coding
    else:
        for name, value in headers:
            if name == "content-length":
                content_length = _joined(content_length, value)
            elif name == "transfer-encoding":
                transfer_coding = _joined(transfer_coding, value)
    if transfer_coding is not None:
        if transfer_coding.rpartition(",")[2].strip().lower() == "chunked":
            return _CHUNKED, 0
        return _OTHER_CODING, 0
    if content_length is None:
        return _NO_FRAMING, 0
    length = _content_length(content_length)
    if length is None:
        return _INVALID, 0
    return _LENGTH, length


def _joined(previous: str | None, value: str) -> str:
    """A repeated field's values as one comma-separated list (RFC 9110 §5.3)."""
    return value if previous is None else f"{previous},{value}"


def _content_length(value: str) -> int | None:
    """The length, or None if not digits or if repeated values disagree."""
    if "," in value:
        values = {part.strip() for part in value.split(",")}
        if len(values) != 1:
            return None
        digits = values.pop()
    else:
        digits = value
    # isascii: str.isdigit accepts superscripts that latin-1 can produce;
    # 18 digits: int() refuses very long decimal strings.
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 18):
        return None
    return int(digits)


def _chunk_end_fits(text: bytes, after: int, chunk: int, size: int) -> bool:
    """Does a chunk of ``chunk`` bytes whose data starts at ``after`` end with its CRLF
    (or the last chunk with the empty trailer section), as far as ``text`` shows?"""
    end = after + chunk
    if end + 2 <= size:
        return text[end : end + 2] == b"\r\n"
    if end < size:  # one byte in view
        return text[end] == 0x0D
    return True  # ends in a later read: _consume_chunk_data_end checks it there


def _chunk_size(line: bytes) -> int | None:
    """Size from a chunk-size line (extensions ignored), or None if malformed."""
    digits = line.partition(b";")[0].strip(b" \t")
    if not digits or len(digits) > 16 or digits.translate(None, _HEX_DIGITS):
        return None
    return int(digits, 16)
