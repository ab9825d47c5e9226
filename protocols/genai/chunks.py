"""What runs per stream chunk: the SSE tap the HTTP/1 parser hands an LLM call's stream to,
and the byte classifiers that tell, without decoding a chunk, whether it is output.

One compiled unit (pyproject.toml ``[tool.otelbpf] compiled``; chunks.pxd makes
:class:`SseTap` an extension type the HTTP/1 parser calls as C methods, and the
in-place classifier C loops over a chunk's bytes). Everything here is about bytes:
which API uses which classifier is said by the API's module (protocols/genai/apis/,
``LlmApi.plain_event``), and what a decoded chunk means too.

A classifier answers for one stream event (its ``event:`` name, "" when none, and its
data; an NDJSON line is an unnamed event): 1 it is an output chunk and carries nothing
else the facts keep, 0 it carries nothing the facts keep, -1 decode it (it may carry
ids, usage, a finish reason, an error, tool calls: anything a quick look does not
settle). Each must answer -1 whenever in doubt: the facts are then the same as if
every event were decoded (the tests hold each to that).
"""

from __future__ import annotations

from protocols.http1.parse import BodyTap

try:
    import cython
except ImportError:  # Cython not installed: run as plain Python

    class cython:  # type: ignore[no-redef]  # noqa: N801 - stands in for the module
        compiled = False


#: The longest ``data:`` value an SseTap reads (a longer line, or event, is cut by SseParser's bounds).
_TAP_MAX_DATA = 64 * 1024 - 6


class SseTap(BodyTap):
    """An LLM call's SSE response, read where the HTTP/1 parser frames it
    (``HttpResponse.body_tap``, see protocols/http1/parse.py's BodyTap), with no BodyData,
    progress event, SseParser pass or SseEvent per chunk: each whole event the tap frames
    (``data: `` and one line, then a blank line) that :func:`openai_plain_chunk`
    settles from its bytes is counted in place (as output or not); any other such event
    (the first chunk, a finish reason, usage, anything unusual; every one with content
    capture) goes to the call at once (``LlmCall.tapped_event``), as the call would read
    it. The tap is the call's only reader while it works, so the call sees the stream in
    order. It stops at bytes it cannot frame (comments, named or multi-line events, CR
    line ends, an event over the SSE bounds): from there the parser hands them on as
    BodyData and the call reads them as usual, after what the tap read. The start of an
    event is held until a later piece completes it (a client reads a stream in pieces of
    any size). Counts go to the call (``LlmCall.tapped``) before it reads anything else:
    when the tap passes it an event, or is released (by the parser, or ``LlmCall.finish``).
    Made by ``LlmCall.stream_tap`` (for the APIs whose ``LlmApi.sse_tap`` says their
    events are such chunks), set by otelbpf/semantics/genai.py."""

    def __init__(
        self, call=None, plain: bool = True, parsed_first: bool = False, layer=None, exchange=None
    ) -> None:
        #: Its call; None for a tap made by the progress filter (GenAiLayer.wants) for an
        #: exchange whose response has not come: it takes its call (``layer.call_for``)
        #: at the response's first piece, when that call adopts it (LlmCall.adopt_tap).
        self.call = call
        self.layer = layer
        self.exchange = exchange
        self.message = None  # the response, from the parser (begin), until the tap takes its call
        #: Takes bytes (False once released, or when its call is dropped).
        self.active = True
        self.plain = plain  # chunks may be settled from their bytes (no content capture)
        self.parsed_first = parsed_first  # the call decoded the first chunk (ids, model)
        self._checked = False  # the call's SSE parser was found idle (at the first piece)
        self.chunks = 0  # output chunks counted, not told to the call yet
        self.first_ns = 0
        self.last_ns = 0
        self.events = 0  # events read, not told to the call yet
        #: The start of an event whose end has not come yet (taken, not read), or None.
        self.carry: bytes | None = None
        self.carry_ts = 0
        # The last chunk classified from a full scan, as a template (compiled build: _classify).
        self._template: bytes | None = None
        self._head = 0  # its bytes up to the opening quote of an output string, that quote included
        self._tail = 0  # its bytes from that string's closing quote on
        self._kind = 0  # what the scan found

    def _classify(self, buf: bytes, start: int, end: int) -> int:
        """:func:`plain_chunk_at` of ``buf[start:end]``. Compiled, the chunks of a stream
        mostly differ in one string (the token): a chunk equal to the last one scanned
        but for the bytes of the string it kept as a template (the value of an output key
        such as ``content``) is answered as that one was, without a scan, when those bytes
        hold no quote, are not empty and are not one of the names looked for. That is
        exact: the scan reads a chunk's quoted names (each runs from a quote to the next)
        and the bytes after them up to a value's first bytes; the names are then those of
        the template (its head and tail are the same bytes, and the string between them is
        no name), in the same order, and no value read crosses into the string but the
        output key's own, which reads a non-empty string either way."""
        if not cython.compiled:
            return plain_chunk_at(buf, start, end)
        text = buf  # unsigned char*, llm.pxd
        template = self._template
        if template is not None:
            head, tail = self._head, self._tail
            size = end - start
            if (
                size > head + tail
                and memcmp(text + start, cython.cast(cython.p_uchar, template), head) == 0  # noqa: F821
                and memcmp(text + end - tail, cython.cast(cython.p_uchar, template) + len(template) - tail, tail) == 0  # noqa: F821
                and memchr(text + start + head, 0x22, size - head - tail) == cython.NULL  # noqa: F821
                and not _is_key_name(text, start + head, size - head - tail)
            ):
                return self._kind
        string_at = -1
        kind = _classify_at(text, start, end, cython.address(string_at))
        if kind >= 0 and string_at >= 0:
            hit = memchr(text + string_at + 1, 0x22, end - string_at - 1)  # noqa: F821 - the string's closing quote
            if hit != cython.NULL:
                close = cython.cast(cython.p_uchar, hit) - text
                if close > string_at + 1 and not _is_key_name(text, string_at + 1, close - string_at - 1):
                    self._template = buf[start:end]
                    self._head = string_at + 1 - start
                    self._tail = end - close
                    self._kind = kind
        return kind

    @property
    def held(self) -> int:
        """Bytes it holds: the start of an unfinished event and its template chunk (each
        bounded by the SSE parser's limits)."""
        return (0 if self.carry is None else len(self.carry)) + (0 if self._template is None else len(self._template))

    def begin(self, message) -> None:
        self.message = message

    def _bind(self) -> bool:
        """A tap made for an exchange by the progress filter takes the exchange's call."""
        layer, exchange, message = self.layer, self.exchange, self.message
        self.layer = self.exchange = self.message = None  # no reference cycle through the messages
        if layer is None:
            return False
        call = layer.call_for(exchange)
        adopt = getattr(call, "adopt_tap", None)  # an LlmCall (protocols/genai/llm.py), not a gRPC call's
        if adopt is None:
            return False
        if not adopt(self, None if message is None else message.header("content-type")):
            return False
        self.call = call
        return True

    def take(self, data: bytes, start: int, stop: int, ts_ns: int) -> int:
        if not self.active:
            return start
        if not self._checked:
            if self.call is None and not self._bind():
                self.active = False
                return start
            if not self.call.tap_ready(self):
                self.active = False
                return start
            self._checked = True
            self.carry_ts = ts_ns  # of a line begun that the call's SSE parser handed over, if any
        carry = self.carry
        carried = 0
        if carry is None:
            buf, pos, end = data, start, stop
        else:
            buf = carry + data[start:stop]
            pos, end = 0, len(buf)
            carried = len(carry)
            self.carry = None
        while pos < end:
            eol = _event_end(buf, pos, end)
            if eol == -1:  # an event begun: held for the next piece
                self.carry = buf[pos:end] if pos or end != len(buf) else buf
                self.carry_ts = ts_ns
                return stop
            if eol < 0:
                break
            kind = -1
            if self.plain and self.parsed_first:
                kind = 0 if eol - pos == 12 and buf[pos + 6 : eol] == b"[DONE]" else self._classify(buf, pos + 6, eol)
            self.events += 1
            if kind < 0:
                self._flush()  # what was counted first
                self.parsed_first = self.call.tapped_event(ts_ns, buf[pos + 6 : eol])
            elif kind:
                if self.chunks == 0:
                    self.first_ns = ts_ns
                self.chunks += 1
                self.last_ns = ts_ns
            pos = eol + 2
        # Every event up to pos was read; the rest (from bytes it cannot frame, if any) is not taken.
        if carry is None:
            return pos
        if pos == 0:
            self.carry = carry  # the held event is one it cannot frame: released first, then this piece
            return start
        return start + pos - carried

    def _flush(self) -> None:
        if self.chunks or self.events:
            chunks, events = self.chunks, self.events
            self.chunks = self.events = 0
            self.call.tapped(chunks, self.first_ns, self.last_ns, events)

    def release(self) -> tuple[bytes, int] | None:
        self.active = False
        if self.call is not None:
            self._flush()
            self.call = None  # no reference cycle with its call (LlmCall._tap)
        self.layer = self.exchange = self.message = None
        carry = self.carry
        if carry is None:
            return None
        self.carry = None
        return carry, self.carry_ts


def _event_end(buf: bytes, pos: int, end: int) -> int:
    """Where the ``data:`` line of the event at ``buf[pos:end]`` ends (its LF, followed
    by the blank line's LF), when that is a whole event an SseTap reads: ``data: `` and a
    value of at most _TAP_MAX_DATA bytes with no CR or LF. -1: it may still become one
    (its end is not in ``buf`` yet); -2: it cannot."""
    avail = end - pos
    if avail < 6:
        return -1 if buf[pos:end] == b"data: "[:avail] else -2
    if cython.compiled:
        text = buf  # unsigned char*, llm.pxd
        if memcmp(text + pos, b"data: ", 6) != 0:  # noqa: F821 - libc, llm.pxd
            return -2
        hit = memchr(text + pos + 6, 0x0A, avail - 6)  # noqa: F821
        stop = end if hit == cython.NULL else cython.cast(cython.p_uchar, hit) - text
        if memchr(text + pos + 6, 0x0D, stop - pos - 6) != cython.NULL:  # noqa: F821
            return -2
        eol = -1 if hit == cython.NULL else stop
    else:
        if not buf.startswith(b"data: ", pos):
            return -2
        eol = buf.find(b"\n", pos + 6, end)
        if buf.find(b"\r", pos + 6, end if eol < 0 else eol) >= 0:
            return -2
    if eol < 0:
        return -1 if avail - 6 <= _TAP_MAX_DATA else -2
    if eol - pos - 6 > _TAP_MAX_DATA:
        return -2
    if eol + 1 == end:
        return -1
    return eol if buf[eol + 1] == 0x0A else -2


# -- reading a stream chunk's bytes without decoding it (LlmCall's events, cheap per chunk) --


def value_at(data: bytes, key: bytes) -> int:
    """Where the value of the first ``key`` (a quoted JSON key, ``b'"usage"'``) starts in
    ``data``: the index of its first byte; -1 when the key is not there (as a key: a
    quoted name followed by a colon); -2 when it is there but not followed as a key
    should be (the caller then decodes the chunk). In a JSON text a quoted name can only
    be a key or a string value (quotes inside strings are escaped), so the first match
    followed by a colon is the key."""
    index = data.find(key)
    if index < 0:
        return -1
    pos = index + len(key)
    size = len(data)
    while pos < size and data[pos] == 0x20:
        pos += 1
    if pos >= size or data[pos] != 0x3A:  # ":"
        return -2
    pos += 1
    while pos < size and data[pos] == 0x20:
        pos += 1
    return pos if pos < size else -2


def absent_or_null(data: bytes, key: bytes) -> bool:
    """Is ``key`` absent from the chunk, or null?"""
    pos = value_at(data, key)
    if pos == -1:
        return True
    return pos >= 0 and data.startswith(b"null", pos)


def nonempty_string(data: bytes, key: bytes) -> int:
    """1: ``key``'s value is a non-empty string; 0: absent, null or ""; -1: anything else."""
    pos = value_at(data, key)
    if pos == -1:
        return 0
    if pos < 0:
        return -1
    first = data[pos]
    if first == 0x22:  # '"'
        return 0 if data[pos + 1 : pos + 2] == b'"' else 1
    if data.startswith(b"null", pos):
        return 0
    return -1


def openai_plain_chunk(data: bytes) -> int:
    """An OpenAI-style stream chunk read from its bytes alone: 1 if it is output, 0 if not,
    -1 when it must be decoded (it may carry usage, a finish reason, an error, several
    choices, tool calls: anything this quick look does not settle)."""
    if data[:1] != b"{" or data.find(b'"choices"') < 0:
        return -1
    if not absent_or_null(data, b'"finish_reason"') or not absent_or_null(data, b'"usage"'):
        return -1
    if data.find(b'"tool_calls"') >= 0 or data.find(b'"error"') >= 0 or data.find(b'"index"', data.find(b'"index"') + 7) >= 0:
        return -1  # tool calls, errors and n > 1 are decoded
    output = 0
    for key in (b'"content"', b'"text"', b'"reasoning_content"', b'"reasoning"'):
        found = nonempty_string(data, key)
        if found < 0:
            return -1
        if found:
            output = 1
    return output


def plain_chunk_at(buf: bytes, start: int, end: int) -> int:
    """:func:`openai_plain_chunk` of ``buf[start:end]``, read in place. Compiled: one
    pass over the chunk's quotes, each looked at as the start of one of the keys that
    function looks for, whose first occurrences (the ``find`` results it works from)
    are then read as it reads them; no object made. tests/test_genai_tap.py holds the
    two to the same answers."""
    if not cython.compiled:
        return openai_plain_chunk(buf[start:end])
    if start < 0 or end > len(buf):
        return -1
    return _classify_at(buf, start, end, cython.NULL)


def _classify_at(text, start: int, end: int, string_at) -> int:
    """Compiled only: :func:`plain_chunk_at`'s scan of ``text[start:end]``. Where
    ``string_at`` is not NULL, it gets the position of the opening quote of the first
    non-empty string value read of an output key (``content``, ``text``, ...), or -1."""
    if end - start < 1 or text[start] != 0x7B:  # "{"
        return -1
    seen = 0  # keys whose first occurrence was read (bits)
    output = 0
    first_index = -1
    q = start
    while q < end:
        if text[q] != 0x22:  # a byte loop: quotes are a few bytes apart (no call per quote)
            q += 1
            continue
        name = q + 1
        q += 1
        if name >= end:
            break
        c = text[name]
        key = 0  # the bit of the key whose name starts here (0: none), its closing quote just before ``after``
        after = 0
        if c == 0x63:  # c
            if _key_at(text, name, end, b"choices", 7):
                seen |= 1
                continue
            if _key_at(text, name, end, b"content", 7):
                key, after = 2, name + 8
        elif c == 0x66:  # f
            if _key_at(text, name, end, b"finish_reason", 13):
                key, after = 4, name + 14
        elif c == 0x75:  # u
            if _key_at(text, name, end, b"usage", 5):
                key, after = 8, name + 6
        elif c == 0x74:  # t
            if _key_at(text, name, end, b"tool_calls", 10):
                return -1  # tool calls are decoded
            if _key_at(text, name, end, b"text", 4):
                key, after = 16, name + 5
        elif c == 0x65:  # e
            if _key_at(text, name, end, b"error", 5):
                return -1
        elif c == 0x69:  # i
            if _key_at(text, name, end, b"index", 5):
                if first_index < 0:
                    first_index = q - 1
                elif q - 1 >= first_index + 7:
                    return -1  # n > 1: decoded
                continue
        elif c == 0x72:  # r
            if _key_at(text, name, end, b"reasoning_content", 17):
                key, after = 32, name + 18
            elif _key_at(text, name, end, b"reasoning", 9):
                key, after = 64, name + 10
        if key == 0 or seen & key:
            continue
        seen |= key
        value = _value_start(text, after, end)
        if value < 0:
            return -1
        if key == 4 or key == 8:  # finish_reason, usage: absent or null, else decoded
            if not (value + 4 <= end and memcmp(text + value, b"null", 4) == 0):  # noqa: F821
                return -1
        elif text[value] == 0x22:  # a string: output unless empty
            if not (value + 1 < end and text[value + 1] == 0x22):
                output = 1
                if string_at != cython.NULL and string_at[0] < 0:
                    string_at[0] = value
        elif not (value + 4 <= end and memcmp(text + value, b"null", 4) == 0):  # noqa: F821
            return -1
    if not seen & 1:
        return -1  # no "choices"
    return output


def _key_at(text, name: int, end: int, key: bytes, size: int) -> bool:
    """Compiled only: ``text[name:]`` is ``key`` and its closing quote."""
    # the closing quote first: most quotes here start a value, or a key of another length
    return name + size < end and text[name + size] == 0x22 and memcmp(text + name, key, size) == 0  # noqa: F821


def _is_key_name(text, start: int, size: int) -> bool:
    """Compiled only: are the ``size`` bytes at ``start`` one of the names
    :func:`_classify_at` looks for?"""
    if size == 7:
        return memcmp(text + start, b"choices", 7) == 0 or memcmp(text + start, b"content", 7) == 0  # noqa: F821
    if size == 5:
        return (
            memcmp(text + start, b"usage", 5) == 0 or memcmp(text + start, b"error", 5) == 0  # noqa: F821
            or memcmp(text + start, b"index", 5) == 0  # noqa: F821
        )
    if size == 4:
        return memcmp(text + start, b"text", 4) == 0  # noqa: F821
    if size == 9:
        return memcmp(text + start, b"reasoning", 9) == 0  # noqa: F821
    if size == 10:
        return memcmp(text + start, b"tool_calls", 10) == 0  # noqa: F821
    if size == 13:
        return memcmp(text + start, b"finish_reason", 13) == 0  # noqa: F821
    if size == 17:
        return memcmp(text + start, b"reasoning_content", 17) == 0  # noqa: F821
    return False


def _value_start(text, pos: int, end: int) -> int:
    """Compiled only: as :func:`value_at` once its key ends at ``pos``: where the value
    starts after blanks, a colon and blanks, or -2."""
    while pos < end and text[pos] == 0x20:
        pos += 1
    if pos >= end or text[pos] != 0x3A:
        return -2
    pos += 1
    while pos < end and text[pos] == 0x20:
        pos += 1
    return pos if pos < end else -2


def responses_delta(event: str, data: bytes) -> bool:
    """A Responses API ``*.delta`` event (output, nothing else to read), by name or type."""
    if event:
        return event.endswith(".delta")
    pos = value_at(data, b'"type"')
    if pos < 0 or data[pos] != 0x22:
        return False
    end = data.find(b'"', pos + 1)
    return end > 0 and data[end - 6 : end] == b".delta"


#: Anthropic events with nothing the facts keep (their bytes are not decoded).
_ANTHROPIC_SKIP = frozenset({"ping", "content_block_start", "content_block_stop", "message_stop"})


def anthropic_plain_event(event: str, data: bytes) -> int:
    """An Anthropic stream event read from its name (or its bytes when unnamed): 1 a
    ``content_block_delta`` (output), 0 nothing to read, -1 decode it (``message_start``,
    ``message_delta``, ``error``, anything else)."""
    if not event:
        pos = value_at(data, b'"type"')
        if pos < 0 or data[pos] != 0x22:
            return -1
        end = data.find(b'"', pos + 1)
        if end < 0:
            return -1
        event = data[pos + 1 : end].decode("ascii", "replace")
    if event == "content_block_delta":
        return 1
    if event in _ANTHROPIC_SKIP:
        return 0
    return -1


def tgi_plain_event(data: bytes) -> int:
    """A TGI stream event read from its bytes alone: 1 a token event (output), 0 a special
    token's event (not output), -1 decode it (the last event carries ``generated_text``
    and ``details``; an error event; anything else)."""
    if data[:1] != b"{" or data.find(b'"error') >= 0:
        return -1
    if not absent_or_null(data, b'"generated_text"') or not absent_or_null(data, b'"details"'):
        return -1
    if value_at(data, b'"token"') < 0 or data.find(b'"token"', data.find(b'"token"') + 7) >= 0:
        return -1
    pos = value_at(data, b'"special"')
    if pos == -2:
        return -1
    if pos >= 0 and data.startswith(b"true", pos):
        return 0
    return 1



def ollama_plain_line(line: bytes) -> int:
    """An Ollama stream line read from its bytes alone: 1 output, 0 not, -1 decode it
    (the last line, ``done`` true, carries the counts and the reason)."""
    if line[:1] != b"{":
        return -1
    pos = value_at(line, b'"done"')
    if pos < 0 or not line.startswith(b"false", pos):
        return -1
    if line.find(b'"eval_count"') >= 0 or line.find(b'"tool_calls"') >= 0 or line.find(b'"error"') >= 0:
        return -1
    output = 0
    for key in (b'"content"', b'"response"', b'"thinking"'):
        found = nonempty_string(line, key)
        if found < 0:
            return -1
        if found:
            output = 1
    return output




# -- one entry per classifier, as an API module names it (``LlmApi.plain_event``) --------


def openai_event(event: str, data: bytes) -> int:
    """An OpenAI-style chat or completion stream chunk (unnamed): :func:`plain_chunk_at`."""
    return plain_chunk_at(data, 0, len(data))


def responses_event(event: str, data: bytes) -> int:
    """An OpenAI Responses API event: a ``*.delta`` is output; any other is decoded."""
    return 1 if responses_delta(event, data) else -1


def anthropic_event(event: str, data: bytes) -> int:
    """An Anthropic Messages API event: :func:`anthropic_plain_event`."""
    return anthropic_plain_event(event, data)


def tgi_event(event: str, data: bytes) -> int:
    """A Hugging Face TGI stream event (unnamed): :func:`tgi_plain_event`."""
    return tgi_plain_event(data)


def ollama_event(event: str, data: bytes) -> int:
    """An Ollama NDJSON line: :func:`ollama_plain_line`."""
    return ollama_plain_line(data)
