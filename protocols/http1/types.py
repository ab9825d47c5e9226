"""HTTP/1.x messages and exchanges, as the parser and stitcher produce them."""

from __future__ import annotations

from dataclasses import dataclass, field

from protocols.base import ExchangeKind, Outcome

try:
    import cython
except ImportError:  # Cython not installed: run as plain Python

    class cython:  # type: ignore[no-redef]  # noqa: N801 - stands in for the module
        compiled = False

#: The protocol id, used everywhere this protocol is named (folder, spans, counters).
PROTOCOL = "http1"


# These classes are built once or more per request. Written as a dataclass over an
# explicit ``__init__`` and ``__slots__`` (fields as bare annotations, defaults in
# ``__init__``), they stay slotted dataclasses as plain Python (eq, repr,
# ``dataclasses.replace``) and become extension types with a C ``__init__`` when
# Cython compiles this module (types.pxd declares their fields). ``None`` stands
# for a fresh empty list.


class FieldBlock:
    """A parsed head's header fields, kept as the text they arrived in.

    Why: a server's response head carries 5-10 fields that no span reads; only
    the framing fields (for the parser) and a few by name (host, user-agent,
    trace context, content-type) are ever looked at. Splitting every field
    into a ``(name, value)`` pair, then freeing the pairs, was a tenth of the
    agent's CPU per traced request. A block answers lookups by name from the
    lower-cased text instead, and splits into pairs only when something walks
    all the fields (iteration, ``len``, indexing, ``==``): then it behaves as
    the list of pairs the parser used to build, with the same names and values.

    Only the parser builds one, and only for heads whose every field line is
    well formed (``name:value``, name not starting with white space, no
    obsolete line folding): so each field starts right after a CRLF, and
    ``CRLF name:`` in the lower-cased text is exactly a field of that name.
    """

    __slots__ = ("content_length", "transfer_coding", "_text", "_lowered", "_before", "_pairs")

    def __init__(self, text: str, first: int, content_length: str | None, transfer_coding: str | None) -> None:
        """``text``: the whole head, decoded latin-1 (lower-casing keeps its
        length); ``first``: where its first field starts, just after a CRLF;
        the framing fields' values (comma-joined when repeated, None when
        absent) as the parser found them while checking the lines."""
        self.content_length = content_length
        self.transfer_coding = transfer_coding
        self._text = text
        self._lowered = None  # lower-cased on the first lookup by name
        self._before = first - 2
        self._pairs = None

    def _search(self, pattern: str, start: int) -> int:
        lowered = self._lowered
        if lowered is None:
            lowered = self._lowered = self._text.lower()
        return lowered.find(pattern, start)

    def get(self, name: str) -> str | None:
        """The first value of field ``name`` (lower-case), or None."""
        pattern = _line_start(name)
        found = self._search(pattern, self._before)
        if found < 0:
            return None
        return self._value_at(found + len(pattern))

    def get_all(self, name: str) -> list[str]:
        """Every value of field ``name`` (lower-case), in order."""
        pattern = _line_start(name)
        values: list[str] = []
        found = self._search(pattern, self._before)
        while found >= 0:
            values.append(self._value_at(found + len(pattern)))
            found = self._search(pattern, found + len(pattern))
        return values

    def has(self, name: str) -> bool:
        return self._search(_line_start(name), self._before) >= 0

    def has_any(self, names: tuple) -> bool:
        """Whether any of ``names`` (lower-case) is a field here."""
        for name in names:
            if self._search(_line_start(name), self._before) >= 0:
                return True
        return False

    def _value_at(self, start: int) -> str:
        end = self._text.find("\r\n", start)
        if end < 0:
            end = len(self._text)
        return self._text[start:end].strip()

    def pairs(self) -> list[tuple[str, str]]:
        """The fields as ``(name lower-cased, value stripped)`` pairs: the rule
        the parser's ``_parse_fields`` applies to every well-formed line."""
        pairs = self._pairs
        if pairs is None:
            pairs = []
            for line in self._text[self._before + 2 :].split("\r\n"):
                name, _, value = line.partition(":")
                pairs.append((name.lower(), value.strip()))
            self._pairs = pairs
        return pairs

    def __iter__(self):
        return iter(self.pairs())

    def __len__(self) -> int:
        return len(self.pairs())

    def __getitem__(self, index):
        return self.pairs()[index]

    def __eq__(self, other) -> bool:
        if type(other) is FieldBlock:
            return self.pairs() == other.pairs()
        if isinstance(other, list):
            return self.pairs() == other
        return NotImplemented

    def __ne__(self, other) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __repr__(self) -> str:
        return repr(self.pairs())


#: ``CRLF name:`` per field name looked up, built once (bounded: names come from code).
_LINE_STARTS: dict[str, str] = {}


def _line_start(name: str) -> str:
    pattern = _LINE_STARTS.get(name)
    if pattern is None:
        pattern = "\r\n" + name + ":"
        if len(_LINE_STARTS) < 256:
            _LINE_STARTS[name] = pattern
    return pattern


@dataclass
class HttpMessageBase:
    __slots__ = ("version", "headers", "start_ns", "head_end_ns", "end_ns", "body_size", "body",
                 "body_truncated", "complete", "trailers", "body_tap")
    version: str  # "1.0" or "1.1"
    #: Header fields in order; names lower-cased, values latin-1 decoded and stripped.
    #: A list of pairs, or (from the parser) a :class:`FieldBlock` that acts as one.
    headers: list[tuple[str, str]]
    start_ns: int  # timestamp of the chunk holding the first byte
    head_end_ns: int  # timestamp of the chunk that completed the head
    end_ns: int  # timestamp of the chunk holding the last byte
    #: Body length in bytes as it crossed the socket (decoded length for chunked),
    #: counting bytes that were not captured.
    body_size: int
    #: Prefix of the (de-chunked) body kept for the consumer: at most the
    #: ``body_limit`` the consumer gave the parser. Every captured body byte
    #: is also reported as a ``BodyData`` event (or taken by ``body_tap``),
    #: whatever this keeps.
    body: bytes
    #: Some body bytes were never seen (capture size, sendfile, gaps).
    body_truncated: bool
    #: False when the message ended without its framing being satisfied
    #: (connection closed mid-body, body length unknown and never ended, ...).
    complete: bool
    #: Trailer fields of a chunked body, like ``headers``.
    trailers: list[tuple[str, str]]
    # body_tap (a slot, no annotation: not a field of the pure dataclass): a reader of the
    # body's pieces that the parser hands them to as it frames them (protocols/http1/parse.py's
    # BodyTap: an LLM call's SSE stream), or None. Not part of the message's value. Compiled,
    # Cython's dataclass makes every C attribute a field: this keeps it out of init, repr and
    # comparison there too (read at compile time; no class attribute in plain Python).
    if cython.compiled:
        body_tap = field(init=False, repr=False, compare=False)

    def __init__(self, version="1.1", headers=None, start_ns=0, head_end_ns=0, end_ns=0, body_size=0,
                 body=b"", body_truncated=False, complete=True, trailers=None) -> None:
        self._init_message(version, headers, start_ns, head_end_ns, end_ns, body_size, body, body_truncated, complete,
                           trailers)

    def _init_message(self, version, headers, start_ns, head_end_ns, end_ns, body_size, body, body_truncated, complete,
                      trailers) -> None:
        """The fields every message has, set in one place for each class's ``__init__``
        (compiled: a final C method, types.pxd, so a direct C call)."""
        self.version = version
        self.headers = [] if headers is None else headers
        self.start_ns = start_ns
        self.head_end_ns = head_end_ns
        self.end_ns = end_ns
        self.body_size = body_size
        self.body = body
        self.body_truncated = body_truncated
        self.complete = complete
        self.trailers = [] if trailers is None else trailers
        self.body_tap = None

    def header(self, name: str) -> str | None:
        """First value of header ``name`` (lower-case), or None."""
        headers = self.headers
        if type(headers) is FieldBlock:
            return headers.get(name)
        for key, value in headers:
            if key == name:
                return value
        return None


@dataclass
class HttpRequest(HttpMessageBase):
    __slots__ = ("method", "target")
    method: str
    target: str  # request-target as sent: path with query, or absolute-form

    def __init__(self, version="1.1", headers=None, start_ns=0, head_end_ns=0, end_ns=0, body_size=0,
                 body=b"", body_truncated=False, complete=True, trailers=None, method="", target="") -> None:
        self._init_message(version, headers, start_ns, head_end_ns, end_ns, body_size, body, body_truncated, complete,
                           trailers)
        self.method = method
        self.target = target


@dataclass
class HttpResponse(HttpMessageBase):
    __slots__ = ("status", "reason", "informational")
    status: int
    reason: str
    #: Status codes of interim 1xx responses that preceded this one.
    informational: list[int]

    def __init__(self, version="1.1", headers=None, start_ns=0, head_end_ns=0, end_ns=0, body_size=0,
                 body=b"", body_truncated=False, complete=True, trailers=None, status=0, reason="",
                 informational=None) -> None:
        self._init_message(version, headers, start_ns, head_end_ns, end_ns, body_size, body, body_truncated, complete,
                           trailers)
        self.status = status
        self.reason = reason
        self.informational = [] if informational is None else informational


@dataclass
class HttpExchange:
    """One request and its response, from one side of one connection
    (an ``Exchange`` of protocols/base.py)."""

    __slots__ = ("request", "response", "kind", "outcome", "protocol", "abandoned_ns", "correlation_key",
                 "reports_progress")
    request: HttpRequest
    response: HttpResponse | None
    #: SERVER when the traced process read the request, CLIENT when it wrote it.
    kind: ExchangeKind
    #: How it ended: COMPLETE, CONNECTION_CLOSED (closed before the response
    #: finished), RESPONSE_MISSING, EVICTED (too many outstanding), or what
    #: the pipeline decided for an exchange its session never ended.
    outcome: Outcome
    protocol: str
    #: When the exchange was given up (the close's timestamp; for EVICTED the
    #: timestamp of the request that pushed it out); 0 when its response ended
    #: it. Lets a span end at the moment it was abandoned rather than when its
    #: request ended.
    abandoned_ns: int
    #: HTTP/1.x answers in order: no key, FIFO pairing.
    correlation_key: None
    #: Whether its session reports its progress (set at start from the
    #: detector's ``progress_filter``; base.py).
    reports_progress: bool

    #: Not a message read by several processes: linked by connection pair (base.py).
    message_key = None

    def __init__(self, request, response=None, kind=ExchangeKind.SERVER, outcome=Outcome.COMPLETE,
                 protocol=PROTOCOL, abandoned_ns=0, correlation_key=None, reports_progress=False) -> None:
        self.request = request
        self.response = response
        self.kind = kind
        self.outcome = outcome
        self.protocol = protocol
        self.abandoned_ns = abandoned_ns
        self.correlation_key = correlation_key
        self.reports_progress = reports_progress

    @property
    def start_ns(self) -> int:
        return self.request.start_ns

    @property
    def end_ns(self) -> int:
        """Last byte of the response; for an abandoned exchange, when it was
        given up (the wait for an answer is part of its duration)."""
        end = self.request.end_ns
        if self.abandoned_ns > end:
            end = self.abandoned_ns
        response = self.response
        if response is not None and response.end_ns > end:
            end = response.end_ns
        return end

    def carrier(self) -> list[tuple[str, str]]:
        """The request's headers: where trace context travels."""
        return self.request.headers
