"""One LLM call's state: :class:`LlmCall`, fed with its HTTP exchange's body pieces as they
cross the socket, read once at the end into :class:`~protocols.genai.facts.LlmFacts`.

The call is generic: what its bytes mean is its API's (``endpoint.api``, an
:class:`~protocols.genai.api.LlmApi` from protocols/genai/apis/), whose hooks it calls
with the request, each stream event and the response. What it does itself is keep
bytes within bounds, frame the response and count:

* the request body: its first :data:`REQUEST_BODY_LIMIT` bytes (64 KiB) for the JSON
  parse, plus its last ``TAIL_LIMIT`` bytes (16 KiB); a longer body, or one that does not
  parse (bytes past the agent's capture size are never seen), is read best-effort by
  scanning the kept head and tail for top-level keys (``LlmApi.parse_request``);
* the response's framing, from its Content-Type (or its first byte when it has none):
  SSE (protocols/genai/sse.py), NDJSON lines (Ollama), an API's own framing
  (``LlmApi.stream_framing``: Gemini's JSON array stream, AWS's binary event stream), or
  one JSON body; a stream is read event by event as it arrives, each event (at most
  64 KiB, an oversized one read from its first 64 KiB and last 16 KiB) decoded and
  dropped, so the final usage event of a stream of any length is always seen;
* a non-streamed JSON response: its first :data:`RESPONSE_BODY_LIMIT` bytes plus its
  last 16 KiB, parsed whole when it fits, otherwise scanned from its ends;
* cheap per chunk: after the first event, an event the API's byte classifier
  (``LlmApi.plain_event``, protocols/genai/chunks.py) settles is only counted, never
  decoded; with content capture every event is decoded.

An *output chunk* is a streamed event that carries output (the API says which:
``call.chunk``); role-only first chunks, usage-only last chunks and ``[DONE]`` are not,
so a server that sends its role chunk at once does not fake a short time to first token.

Prompt and completion text are kept only when ``capture_content`` is set, at most
``content_limit`` characters each (prompt, completion). Nothing here ever raises: a
malformed body yields fewer facts (``errors`` counts internal failures, ``parse_errors``
bytes a framing could not read).

An OpenAI-style SSE stream over HTTP/1 may instead be read where the HTTP/1 parser frames
it (:meth:`LlmCall.stream_tap`, protocols/genai/chunks.py's SseTap): the same facts.
"""

from __future__ import annotations

from protocols.genai.chunks import SseTap
from protocols.genai.facts import Endpoint, LlmFacts
from protocols.genai.jsonutil import TAIL_LIMIT, keep, loads
from protocols.genai.sse import LineSplitter, SseEvent, SseParser

#: Request-body bytes kept for the JSON parse.
REQUEST_BODY_LIMIT = 64 * 1024
#: Non-streamed response-body bytes kept for the JSON parse.
RESPONSE_BODY_LIMIT = 64 * 1024
#: Characters of prompt text, and of completion text, kept when content capture is on.
CONTENT_LIMIT = 16 * 1024
#: Choices (``n``) whose finish reasons are tracked.
MAX_CHOICES = 16

#: How the response body is read (``LlmCall.mode``): not known yet (0), Server-Sent
#: Events, NDJSON lines, one JSON body, or an API's own framing (``LlmApi.stream_framing``).
SSE, NDJSON, JSON, FRAMED = 1, 2, 3, 4
_NDJSON_TYPES = ("application/x-ndjson", "application/jsonl", "application/jsonlines")

__all__ = [
    "CONTENT_LIMIT", "FRAMED", "JSON", "MAX_CHOICES", "NDJSON", "REQUEST_BODY_LIMIT", "RESPONSE_BODY_LIMIT", "SSE",
    "TAIL_LIMIT", "Endpoint", "LlmCall", "LlmFacts",
]  # fmt: skip


class LlmCall:
    """One LLM call's state, fed with its exchange's body chunks in order."""

    __slots__ = (
        "endpoint", "api", "capture_content", "request_limit", "response_limit", "content_limit", "errors",
        "parse_errors", "req_head", "req_tail", "req_size", "req_gap", "_request", "mode", "_sse", "_lines", "_framer",
        "_resp_head", "_resp_tail", "_resp_size", "_resp_gap", "facts", "_finish", "_output", "_budget", "_ended",
        "_accepted", "parsed_first", "shaped", "scratch", "_tap", "_plain",
    )  # fmt: skip

    def __init__(
        self,
        endpoint: Endpoint,
        capture_content: bool = False,
        request_limit: int = REQUEST_BODY_LIMIT,
        response_limit: int = RESPONSE_BODY_LIMIT,
        content_limit: int = CONTENT_LIMIT,
    ) -> None:
        self.endpoint = endpoint
        #: The API that reads it (protocols/genai/api.py's LlmApi).
        self.api = endpoint.api
        self.capture_content = capture_content
        self.request_limit = request_limit
        self.response_limit = response_limit
        self.content_limit = content_limit
        #: Internal failures swallowed (a bug, not bad input: bad input is just ignored).
        self.errors = 0
        #: Bytes a stream framing could not read (a bad checksum, a malformed frame).
        self.parse_errors = 0
        self.req_head = bytearray()
        self.req_tail = b""
        self.req_size = 0
        self.req_gap = False  # request body bytes were lost: parse it best effort
        self._request: dict | None = None  # parsed lazily
        self.mode = 0
        self._sse: SseParser | None = None
        self._lines: LineSplitter | None = None
        self._framer = None  # an API's StreamFraming (mode FRAMED)
        self._resp_head = bytearray()
        self._resp_tail = b""
        self._resp_size = 0
        self._resp_gap = False  # response body bytes were lost (the facts say so: gaps)
        #: What the call showed, written by its API's hooks.
        self.facts = LlmFacts(endpoint)
        self._finish: dict[int, str] = {}
        self._output: list[str] = []
        self._budget = content_limit
        self._ended = False
        self._accepted = False
        #: The first streamed event was decoded (ids, model): later ones may be classified from their bytes.
        self.parsed_first = False
        #: The response had the API's shape (an API that names no model: TGI).
        self.shaped = False
        #: The API's own per-call notes (None until it keeps some).
        self.scratch: dict | None = None
        self._tap: SseTap | None = None  # the reader of its SSE bytes in the HTTP/1 parser, if one was made
        self._plain = endpoint.api.plain_event

    # -- feeding ---------------------------------------------------------------

    @property
    def buffered(self) -> int:
        """Bytes held (bounded by the limits, whatever was fed)."""
        held = len(self.req_head) + len(self.req_tail) + len(self._resp_head) + len(self._resp_tail)
        if self._sse is not None:
            held += self._sse.buffered
        if self._lines is not None:
            held += self._lines.buffered
        if self._framer is not None:
            held += self._framer.buffered
        if self._tap is not None:
            held += self._tap.held
        return held

    def request_body(self, data: bytes | None) -> None:
        try:
            if data is None:  # a hole: bytes the capture lost
                self.req_gap = True
                return
            self.req_size += len(data)
            self.req_head, self.req_tail = keep(self.req_head, self.req_tail, data, self.request_limit)
        except Exception:  # noqa: BLE001 - never raise on what a traced program sends
            self.errors += 1

    def header(self, response: bool, name: str, value: str | None) -> None:
        """A header its API asked for (``LlmApi.request_headers`` / ``response_headers``)."""
        try:
            self.api.header(self, response, name, value)
        except Exception:  # noqa: BLE001
            self.errors += 1

    def response_start(self, content_type: str | None) -> None:
        """The response head arrived; its Content-Type picks the body's format."""
        try:
            kind = (content_type or "").partition(";")[0].strip().lower()
            framer = self.api.stream_framing(self, kind) if kind else None
            if framer is not None:
                self._start_framer(framer)
            elif kind == "text/event-stream":
                self._start_mode(SSE)
            elif kind in _NDJSON_TYPES:
                self._start_mode(NDJSON)
            elif kind:
                self._start_mode(JSON)
        except Exception:  # noqa: BLE001
            self.errors += 1

    def response_body(self, ts_ns: int, data: bytes | None) -> None:
        try:
            tap = self._tap
            if tap is not None and tap.active:
                # The tap reads the stream (the HTTP/1 parser hands it what comes next): the
                # pieces reported before it was set come to it here, in order, until one it
                # cannot read, from which the call reads as usual.
                if type(data) is bytes:
                    taken = tap.take(data, 0, len(data), ts_ns)
                    if taken >= len(data):
                        return
                    data = data[taken:]
                held = tap.release()
                if held is not None:
                    self._response_piece(held[1], held[0])
            self._response_piece(ts_ns, data)
        except Exception:  # noqa: BLE001
            self.errors += 1

    def _response_piece(self, ts_ns: int, data: bytes | None) -> None:
        try:
            if data is None:
                self._response_gap()
                return
            if not self.mode:
                self._sniff(data)
            mode = self.mode
            if mode == SSE:
                assert self._sse is not None
                for event in self._sse.feed(data):
                    self._on_event(ts_ns, event)
            elif mode == NDJSON:
                assert self._lines is not None
                for line, tail in self._lines.feed(data):
                    self._on_line(ts_ns, line, tail)
            elif mode == JSON:
                self._resp_size += len(data)
                self._resp_head, self._resp_tail = keep(self._resp_head, self._resp_tail, data, self.response_limit)
            elif mode == FRAMED:
                for event in self._framer.feed(data):
                    self._on_event(ts_ns, event)
        except Exception:  # noqa: BLE001
            self.errors += 1

    def _response_gap(self) -> None:
        """Response bytes were lost here (a truncated or lost capture): streams resume at
        their next trustworthy boundary (SseParser.gap, LineSplitter.gap, the framing's
        gap); a JSON body is then read from its kept head and tail only."""
        self._resp_gap = True
        self.facts.gaps += 1
        if self._sse is not None:
            self._sse.gap()
        elif self._lines is not None:
            self._lines.gap()
        elif self._framer is not None:
            self._framer.gap()

    def finish(self) -> LlmFacts | None:
        """The facts, once the exchange is over; None if it was not the API's call (the
        request was not a JSON object, or the API did not recognise what it saw)."""
        try:
            if self._tap is not None:
                self._tap.release()  # what it counted (it takes nothing more)
            return self._finish_facts()
        except Exception:  # noqa: BLE001
            self.errors += 1
            return None

    # -- what the API's hooks use ----------------------------------------------------

    def request(self) -> dict | None:
        """The request's top-level fields (parsed once; best effort when over the limit)."""
        if self._request is None:
            self._request = self.api.parse_request(self)
        return self._request if self._request else None

    def decode(self, data: bytes) -> dict | None:
        """``data`` as a JSON object, or None (protocols/genai/jsonutil.py's ``loads``)."""
        return loads(data)

    def chunk(self, ts_ns: int) -> None:
        """An output chunk arrived at ``ts_ns``."""
        facts = self.facts
        if facts.chunks == 0:
            facts.first_chunk_ns = ts_ns
        facts.chunks += 1
        facts.last_chunk_ns = ts_ns

    def finish_reason(self, index: int, reason) -> None:
        """The finish reason of choice ``index`` (a non-empty string; at most MAX_CHOICES kept)."""
        if isinstance(reason, str) and reason and (index in self._finish or len(self._finish) < MAX_CHOICES):
            self._finish[index] = reason

    def capture_output(self, text: str) -> None:
        """Output text (kept only with content capture, within its budget)."""
        if not self.capture_content:
            return
        if self._budget <= 0:
            self.facts.content_truncated = True
            return
        if len(text) > self._budget:
            text = text[: self._budget]
            self.facts.content_truncated = True
        self._budget -= len(text)
        self._output.append(text)

    # -- the response's framing ------------------------------------------------------

    def _start_mode(self, mode: int) -> None:
        if self.mode:
            return
        self.mode = mode
        if mode == SSE:
            self._sse = SseParser()
            self.facts.streamed = True
        elif mode == NDJSON:
            self._lines = LineSplitter()
            self.facts.streamed = True

    def _start_framer(self, framer) -> None:
        if self.mode:
            return
        self.mode = FRAMED
        self._framer = framer
        self.facts.streamed = True

    def _sniff(self, data: bytes) -> None:
        first = data.lstrip()[:1]
        if not first:
            return
        if first in (b"d", b"e", b":", b"i", b"r"):  # data:, event:, comment, id:, retry:
            self._start_mode(SSE)
            return
        how = self.api.sniff(self, first)
        if type(how) is int:
            self._start_mode(how)
        else:
            self._start_framer(how)

    # -- stream events -----------------------------------------------------------------

    def _on_event(self, ts_ns: int, event: SseEvent) -> None:
        """One stream event (SSE, or an API framing's): counted from its bytes when the
        API's classifier settles it, else decoded and given to the API."""
        if event.truncated:  # too big to keep: output, and its ends may still hold ids and usage
            self.api.truncated_event(self, ts_ns, event.event, event.data, event.tail)
            return
        data = event.data
        if self.parsed_first and not self.capture_content:
            plain = self._plain
            if plain is not None:
                # Cheap per chunk: a chunk that carries no usage and no finish reason is
                # only counted (is it output?) from its bytes, never decoded.
                kind = plain(event.event, data)
                if kind > 0:
                    self.chunk(ts_ns)
                    return
                if kind == 0:
                    return
        data = data.strip()
        if not data or data == b"[DONE]":
            return
        obj = loads(data)
        if obj is None:
            return
        self.parsed_first = True
        self.api.event(self, ts_ns, event.event, obj)

    def _on_line(self, ts_ns: int, line: bytes, tail: bytes | None) -> None:
        """One NDJSON line: an unnamed event (a cut one carries its ``tail``)."""
        if tail is not None:  # a line too long to keep: output; its end may hold the counts
            self.api.truncated_event(self, ts_ns, "", line, tail)
            return
        if self.parsed_first and not self.capture_content:
            plain = self._plain
            if plain is not None:
                kind = plain("", line)
                if kind > 0:
                    self.chunk(ts_ns)
                    return
                if kind == 0:
                    return
        line = line.strip()
        if not line:
            return
        obj = loads(line)
        if obj is not None:
            self.parsed_first = True
            self.api.event(self, ts_ns, "", obj)

    # -- the stream read in the HTTP/1 parser (SseTap) ----------------------------

    def stream_tap(self) -> SseTap | None:
        """A reader of the rest of this call's SSE response for the HTTP/1 parser to hand
        its body pieces to (``HttpResponse.body_tap``): an SSE response of an API whose
        events are unnamed JSON chunks (``LlmApi.sse_tap``: OpenAI-compatible; not the
        Anthropic, Responses and TGI streams, read by their own rules); None otherwise,
        or while one is at work. The facts are the same as :meth:`response_body` would
        make of the pieces (tests/test_genai_tap.py)."""
        if self.mode != SSE or self._sse is None or not self.api.sse_tap:
            return None
        tap = self._tap
        if tap is not None and tap.active:
            return None
        tap = SseTap(self, not self.capture_content, self.parsed_first)
        self._tap = tap
        return tap

    def adopt_tap(self, tap: SseTap, content_type: str | None) -> bool:
        """``tap``, made for this call's exchange before its response came (GenAiLayer.wants),
        reads that response from its first byte when it is an SSE stream: the call reads
        the response's head (its content type) now if it has not yet (the progress event of
        the head, handled later, then changes nothing)."""
        current = self._tap
        if current is not None and current.active:
            return False
        if not self.mode:
            self.response_start(content_type)
        if self.mode != SSE or self._sse is None or not self.api.sse_tap:
            return False
        tap.plain = not self.capture_content
        tap.parsed_first = self.parsed_first
        self._tap = tap
        return True

    def drop_tap(self) -> None:
        """The call is forgotten (evicted): its tap takes nothing more, and drops what it held."""
        tap = self._tap
        if tap is not None:
            tap.active = False
            tap.carry = None
            tap.call = None

    def tap_ready(self, tap: SseTap) -> bool:
        """May ``tap`` take the stream's next bytes? It is this call's, and the SSE parser
        has nothing in progress (what was fed to it before the tap's first piece is read)
        but maybe the start of an event, which the tap takes over (its ``carry``)."""
        if tap is not self._tap or self._sse is None:
            return False
        held = self._sse.hand_over()
        if held is None:
            return False
        if held:
            tap.carry = held
        return True

    def tapped_event(self, ts_ns: int, data: bytes) -> bool:
        """One whole event a tap read but did not settle (the first chunk, one with usage or a
        finish reason, anything unusual; every one with content capture): read here, as
        :meth:`response_body` would. Returns whether the first chunk was decoded by now."""
        try:
            self._on_event(ts_ns, SseEvent(data))
        except Exception:  # noqa: BLE001
            self.errors += 1
        return self.parsed_first

    def tapped(self, chunks: int, first_ns: int, last_ns: int, events: int) -> None:
        """What a tap counted, in the order of the stream (before what comes next)."""
        if chunks:
            facts = self.facts
            if facts.chunks == 0:
                facts.first_chunk_ns = first_ns
            facts.chunks += chunks
            facts.last_chunk_ns = last_ns
        if events and self._sse is not None:
            self._sse.events += events

    # -- the end -----------------------------------------------------------------

    def _finish_facts(self) -> LlmFacts | None:
        facts = self.facts
        if self._ended:  # finish() once; a second call gets the same answer
            return facts if self._accepted else None
        request = self.request()
        if request is None:
            return None
        self._ended = True
        api = self.api
        api.request_facts(self, request, facts)
        facts.stream = api.request_stream(self, request)
        if self.capture_content and "\0truncated" not in request:
            facts.input_messages = self._kept_input(api.input_messages(self, request))
        elif self.capture_content:
            facts.content_truncated = True
        mode = self.mode
        if mode == JSON:
            whole = self._resp_size <= self.response_limit and not self._resp_gap
            api.read_response(self, self._resp_head, self._resp_tail, whole)
        elif mode == NDJSON and self._lines is not None:
            last = self._lines.pending()  # a last line without its newline
            if last is not None and last[1] is None:
                obj = loads(last[0].strip())
                if obj is not None:
                    api.event(self, facts.last_chunk_ns, "", obj)
        elif mode == FRAMED:
            self.parse_errors += self._framer.errors
        api.finish(self, request, facts)
        self._accepted = api.is_call(self, request, facts)
        if not self._accepted:
            return None
        if self._finish:
            facts.finish_reasons = tuple(self._finish[index] for index in sorted(self._finish))
        if self.capture_content and self._output:
            facts.output_text = "".join(self._output)
        return facts

    def _kept_input(self, messages: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The input messages within the input's own budget (the output has another)."""
        kept: list[tuple[str, str]] = []
        budget = self.content_limit
        for role, text in messages:
            if budget <= 0:
                self.facts.content_truncated = True
                break
            if len(text) > budget:
                text = text[:budget]
                self.facts.content_truncated = True
            budget -= len(text)
            kept.append((role, text))
        return kept
