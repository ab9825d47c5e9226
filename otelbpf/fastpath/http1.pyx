# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""HTTP/1.x on the compiled fast path: whole messages of the common shape, parsed in C.

The reference (``protocols/http1``: ``HttpParser`` + ``Http1Session``) is the
specification. This session gives exactly the session events the reference gives,
for the traffic most connections carry, at a fraction of the cost:

* a request or a response that arrives whole in one captured read or write (head,
  and a body framed by ``Content-Length`` that ends in the same event, or whose
  uncaptured tail is exactly the ``missing`` byte count);
* a response whose head arrives whole and whose ``Content-Length`` body goes on in
  later events (servers that write the head and the body apart, as Python's
  ``http.server`` does), each piece captured whole;
* a head of well-formed ``name:value`` lines, printable start line, a standard method
  other than CONNECT, a final status (200-599, or any non-1xx but 101);
* one request at a time (no pipelining).

The head is checked and its framing fields found in one C pass over the captured
bytes; no regex, no parser events, no intermediate buffers. Anything else (a
request, or a head, split across events, chunked bodies, 1xx responses, upgrades, a
capture gap that is not exactly a body's tail, an LLM call whose progress is observed,
...) is handed to a reference ``Http1Session`` where the fast path stopped: the
reference gets the bytes the fast path did not take, and the exchange still waiting
for its response (``Http1Session.adopt_pending``), or the response whose body is being
read, with what was read of it (``Http1Session.adopt_answering``). When the reference
is back at rest (``Http1Session.at_rest``) the connection returns to the fast path.

tests/test_fastpath_http1.py feeds both this session and the reference the same
events (golden captures, and generated conversations cut at random boundaries) and
demands identical session events, exchanges and spans.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeLatin1
from libc.string cimport memchr, memcmp

from protocols.base cimport ExchangeCompleted, ExchangeStarted
from protocols.http1.types cimport FieldBlock, HttpExchange, HttpRequest, HttpResponse

from protocols.base import Direction, ExchangeKind, Outcome, abandon
from protocols.http1.stitch import Http1Session
from protocols.http1.types import PROTOCOL

#: Longest head taken here (the reference allows 64 KiB; longer ones are rare).
DEF MAX_FAST_HEAD = 16384
#: Most header lines taken here (the reference allows 256).
DEF MAX_FAST_LINES = 128

#: Methods taken here, in the order of METHOD_NAMES (CONNECT opens a tunnel: reference).
cdef tuple METHOD_NAMES = ("GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE", "PATCH", "QUERY")
DEF M_HEAD = 1
cdef tuple VERSIONS = tuple(f"1.{d}" for d in range(10))
cdef object _CLOSED = Outcome.CONNECTION_CLOSED


cdef struct Head:
    # Where a message's parts lie in the captured bytes (offsets from the start).
    Py_ssize_t head_len       # bytes before the CRLFCRLF that ends the head
    Py_ssize_t line_end       # end of the start line (== head_len when no field follows)
    Py_ssize_t target_off     # request: target; response: reason (stripped)
    Py_ssize_t target_len
    int method                # index in METHOD_NAMES (requests)
    int status                # responses
    int minor                 # HTTP/1.<minor>
    long long content_length  # -1: no Content-Length field
    Py_ssize_t cl_off         # the field's value, stripped of blanks
    Py_ssize_t cl_len


cdef inline bint _lower_equals(const unsigned char* p, const char* name, Py_ssize_t n):
    """``p[:n]`` lower-cased equals ``name`` (lower-case ASCII)."""
    cdef Py_ssize_t i
    cdef unsigned char c
    for i in range(n):
        c = p[i]
        if 65 <= c <= 90:
            c += 32
        if c != <unsigned char>name[i]:
            return False
    return True


cdef int _method_index(const unsigned char* p, Py_ssize_t n):
    cdef int i
    cdef bytes name
    if n < 3 or n > 7:
        return -1
    for i in range(len(METHOD_NAMES)):
        name = (<str>METHOD_NAMES[i]).encode("ascii")
        if PyBytes_GET_SIZE(name) == n and memcmp(PyBytes_AS_STRING(name), p, n) == 0:
            return i
    return -1


cdef bint _fields(const unsigned char* p, Py_ssize_t start, Py_ssize_t head_len, Head* h):
    """Check the field lines from ``start`` to ``head_len`` as the reference's
    ``HttpParser._fields`` does for a FieldBlock, and find Content-Length. False: a
    shape left to the reference (a malformed or folded line, Transfer-Encoding, a
    repeated or non-decimal Content-Length, control bytes, too many lines)."""
    cdef Py_ssize_t pos = start, end, colon, i, a, b, lines = 0
    cdef unsigned char c
    cdef long long value
    h.content_length = -1
    while pos < head_len:
        lines += 1
        if lines > MAX_FAST_LINES:
            return False
        c = p[pos]
        if c == 32 or c == 9 or c == 58:  # folded line, or an empty name
            return False
        colon = -1
        end = pos
        while end < head_len:
            c = p[end]
            if c == 13:
                if end + 1 < head_len and p[end + 1] == 10:
                    break
                return False  # bare CR: left to the reference
            if c == 10 or c == 0 or c == 127:
                return False
            if c == 58 and colon < 0:
                colon = end
            end += 1
        if colon < 0:
            return False
        c = p[pos] | 32  # the name's first letter, lower-cased: most fields are neither
        if c == 116 and colon - pos == 17 and _lower_equals(p + pos, b"transfer-encoding", 17):
            return False
        if c == 99 and colon - pos == 14 and _lower_equals(p + pos, b"content-length", 14):
            if h.content_length >= 0:
                return False  # repeated: the reference joins and compares them
            a = colon + 1
            b = end
            while a < b and (p[a] == 32 or p[a] == 9):
                a += 1
            while b > a and (p[b - 1] == 32 or p[b - 1] == 9):
                b -= 1
            if b == a or b - a > 18:
                return False
            value = 0
            for i in range(a, b):
                c = p[i]
                if c < 48 or c > 57:
                    return False
                value = value * 10 + (c - 48)
            h.content_length = value
            h.cl_off = a
            h.cl_len = b - a
        pos = end + 2
    return True


cdef Py_ssize_t _head_end(const unsigned char* p, Py_ssize_t n):
    """Offset of the first CRLFCRLF in ``p[:n]`` (within MAX_FAST_HEAD), or -1: libc's
    memchr finds each CR, so the head's text is skipped a word at a time."""
    cdef const unsigned char* at = p
    cdef const unsigned char* cr
    cdef Py_ssize_t limit = n - 3
    if limit > MAX_FAST_HEAD:
        limit = MAX_FAST_HEAD
    while at < p + limit:
        cr = <const unsigned char*>memchr(at, 13, (p + limit) - at)
        if cr == NULL:
            return -1
        if cr[1] == 10 and cr[2] == 13 and cr[3] == 10:
            return cr - p
        at = cr + 1
    return -1


cdef bint _version(const unsigned char* p, Head* h):
    """``HTTP/1.<digit>`` at ``p`` (8 bytes, already known to be there)."""
    if memcmp(p, b"HTTP/1.", 7) != 0 or p[7] < 48 or p[7] > 57:
        return False
    h.minor = p[7] - 48
    return True


cdef bint parse_request_head(const unsigned char* p, Py_ssize_t n, Head* h):
    """A whole request head of the common shape at the start of ``p[:n]``."""
    cdef Py_ssize_t head_len = _head_end(p, n), i, sp
    if head_len < 0:
        return False
    h.head_len = head_len
    sp = 0
    while sp < head_len and sp < 8 and p[sp] != 32:
        sp += 1
    h.method = _method_index(p, sp)
    if h.method < 0 or sp >= head_len:
        return False
    h.target_off = sp + 1
    i = h.target_off
    while i < head_len and 33 <= p[i] <= 126:
        i += 1
    h.target_len = i - h.target_off
    if h.target_len == 0 or i >= head_len or p[i] != 32 or i + 9 > head_len:
        return False
    if not _version(p + i + 1, h):
        return False
    h.line_end = i + 9
    if h.line_end == head_len:
        h.content_length = -1
        return True
    if p[h.line_end] != 13 or p[h.line_end + 1] != 10:
        return False
    return _fields(p, h.line_end + 2, head_len, h)


cdef bint parse_response_head(const unsigned char* p, Py_ssize_t n, Head* h):
    """A whole final-response head of the common shape at the start of ``p[:n]``."""
    cdef Py_ssize_t head_len = _head_end(p, n), i, a, b
    cdef unsigned char c
    if head_len < 12:
        return False
    h.head_len = head_len
    if not _version(p, h) or p[8] != 32:
        return False
    if not (49 <= p[9] <= 57 and 48 <= p[10] <= 57 and 48 <= p[11] <= 57):
        return False
    h.status = (p[9] - 48) * 100 + (p[10] - 48) * 10 + (p[11] - 48)
    i = 12
    while i < head_len and p[i] != 13:
        c = p[i]
        if c < 32 or c > 126:
            return False  # control or non-ASCII bytes in the reason: the reference strips those
        i += 1
    if i > 12 and p[12] != 32:
        return False
    h.line_end = i
    a = 13 if i > 12 else 12
    b = i
    while a < b and p[a] == 32:
        a += 1
    while b > a and p[b - 1] == 32:
        b -= 1
    h.target_off = a
    h.target_len = b - a
    if h.line_end == head_len:
        h.content_length = -1
        return True
    if p[h.line_end + 1] != 10:
        return False
    return _fields(p, h.line_end + 2, head_len, h)


cdef class FastCounts:
    """How much traffic the fast path took, shared by a detector's sessions (C counters:
    nothing per exchange but an increment). ``take()`` reads and resets them."""

    cdef public unsigned long long exchanges
    cdef public unsigned long long handoffs

    def take(self):
        """(exchanges completed on the fast path, hand-overs to the reference) since the last take."""
        taken = (self.exchanges, self.handoffs)
        self.exchanges = 0
        self.handoffs = 0
        return taken


cdef class _TextMemo:
    """The last text made from some bytes, kept per connection: a connection repeats
    the same target, reason and Content-Length, and a comparison costs less than
    decoding (and allocating) it again."""

    cdef bytes raw
    cdef str text

    cdef str get(self, const unsigned char* p, Py_ssize_t n):
        cdef bytes raw = self.raw
        if raw is not None and PyBytes_GET_SIZE(raw) == n and memcmp(PyBytes_AS_STRING(raw), p, n) == 0:
            return self.text
        self.raw = PyBytes_FromStringAndSize(<const char*>p, n)
        self.text = PyUnicode_DecodeLatin1(<const char*>p, n, NULL)
        return self.text


cdef class _HeadMemo:
    """The last head's field block, kept per connection and direction: keep-alive clients
    send the same head again and again (servers too, but for the date), and a block
    shared by equal heads is decoded, and lower-cased for look-ups, once. A block is
    never changed once made, so sharing it is not visible."""

    cdef bytes raw
    cdef FieldBlock block

    cdef FieldBlock get(self, const unsigned char* p, Head* h, _TextMemo lengths):
        cdef bytes raw = self.raw
        cdef Py_ssize_t n = h.head_len
        if raw is not None and PyBytes_GET_SIZE(raw) == n and memcmp(PyBytes_AS_STRING(raw), p, n) == 0:
            return self.block
        self.raw = PyBytes_FromStringAndSize(<const char*>p, n)
        self.block = FieldBlock(
            PyUnicode_DecodeLatin1(<const char*>p, n, NULL),
            h.line_end + 2,
            lengths.get(p + h.cl_off, h.cl_len) if h.content_length >= 0 else None,
            None,
        )
        return self.block


cdef class FastHttp1Session:
    """``Session`` (protocols/base.py) for one HTTP/1.x connection: the common shape in
    C, the rest through a reference ``Http1Session`` (module docstring). Built by the
    fast path's HTTP/1 detector (``otelbpf.fastpath.FastHttp1Detector``) with the same
    options as the reference session it stands for."""

    cdef public object request_direction
    cdef public object kind
    cdef public bint progress
    cdef public object progress_filter
    cdef public Py_ssize_t max_pending
    cdef public Py_ssize_t body_limit
    cdef public object protocol
    #: The reference session while it has the connection, else None.
    cdef public object reference
    cdef FastCounts counts
    cdef Py_ssize_t _carried_errors
    #: The exchange whose request was read and whose response has not begun.
    cdef HttpExchange _pending
    cdef int _pending_method
    cdef _TextMemo _targets
    cdef _TextMemo _reasons
    cdef _TextMemo _lengths
    cdef _HeadMemo _request_heads
    cdef _HeadMemo _response_heads
    cdef int _request_code
    #: The exchange whose final response's head was read and whose body is still coming
    #: (``_remaining`` bytes; ``_parts``: what is kept of it, ``_kept`` bytes; the newest
    #: byte read at ``_last_byte_ns``): what the reference's parser would hold then.
    cdef HttpExchange _answering
    cdef long long _remaining
    cdef list _parts
    cdef Py_ssize_t _kept
    cdef long long _last_byte_ns

    def __init__(self, request_direction, body_limit=65536, max_pending=256, progress=True, progress_filter=None,
                 FastCounts counts=None):
        self.request_direction = request_direction
        self._request_code = int(request_direction)
        self.kind = ExchangeKind.for_request(request_direction)
        self.progress = progress
        self.progress_filter = progress_filter
        self.max_pending = max_pending
        self.body_limit = body_limit
        self.protocol = PROTOCOL
        self.reference = None
        self.counts = counts if counts is not None else FastCounts()
        self._carried_errors = 0
        self._pending = None
        self._pending_method = -1
        self._targets = _TextMemo()
        self._reasons = _TextMemo()
        self._lengths = _TextMemo()
        self._request_heads = _HeadMemo()
        self._response_heads = _HeadMemo()
        self._answering = None

    @property
    def parse_errors(self):
        """Malformed bytes the reference skipped while it had the connection (the fast
        path takes only well-formed messages)."""
        reference = self.reference
        return self._carried_errors + (reference.parse_errors if reference is not None else 0)

    def feed(self, direction, bytes data, long long ts_ns, long long missing=0):
        cdef list out
        reference = self.reference
        if reference is None:
            if int(direction) == self._request_code:
                out = self._request(data, ts_ns, missing)
            elif self._answering is not None:
                out = self._response_body(data, ts_ns, missing)
            else:
                out = self._response(data, ts_ns, missing)
            if out is not None:
                return out
            reference = self._hand_over()
        out = reference.feed(direction, data, ts_ns, missing)
        if reference.at_rest():
            self._carried_errors += reference.parse_errors
            self.reference = None
        return out

    def close(self, long long ts_ns):
        if self.reference is not None:
            return self.reference.close(ts_ns)
        if self._answering is not None:  # cut in the middle of a body: the reference ends it
            return self._hand_over().close(ts_ns)
        out = []
        if self._pending is not None:
            out.append(abandon(self._pending, _CLOSED, ts_ns))
            self._pending = None
        return out

    cdef object _hand_over(self):
        """The reference takes the connection where the fast path stopped: between
        messages, with the exchange still waiting for its response, if any; or in the
        middle of a response's body, with what was read of it."""
        reference = Http1Session(
            self.request_direction,
            body_limit=self.body_limit,
            max_pending=self.max_pending,
            progress=self.progress,
            progress_filter=self.progress_filter,
        )
        if self._pending is not None:
            reference.adopt_pending(self._pending)
            self._pending = None
        elif self._answering is not None:
            reference.adopt_answering(self._answering, self._remaining, self._parts, self._last_byte_ns)
            self._answering = None
            self._parts = None
        self.reference = reference
        self.counts.handoffs += 1
        return reference

    cdef list _request(self, bytes data, long long ts_ns, long long missing):
        """A whole request: its exchange started, or None (the reference takes it)."""
        cdef Head h
        cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(data), body_start, body_len, kept
        cdef HttpRequest request
        cdef HttpExchange exchange
        if missing != 0 or self._pending is not None or self._answering is not None or not parse_request_head(p, n, &h):
            return None
        body_start = h.head_len + 4
        body_len = h.content_length if h.content_length > 0 else 0
        if n != body_start + body_len:
            return None  # body still to come, or a pipelined request after it
        request = HttpRequest(VERSIONS[h.minor], None, ts_ns, ts_ns, ts_ns, body_len)
        request.method = METHOD_NAMES[h.method]
        request.target = self._targets.get(p + h.target_off, h.target_len)
        if h.line_end < h.head_len:
            request.headers = self._request_heads.get(p, &h, self._lengths)
        if body_len and self.body_limit > 0:
            kept = body_len if body_len <= self.body_limit else self.body_limit
            request.body = data[body_start:body_start + kept]
        exchange = HttpExchange(request, None, self.kind)
        if self.progress:
            wanted = self.progress_filter
            if wanted is None or wanted(exchange):
                return None  # its progress is observed (an LLM call): the reference reports it
        self._pending = exchange
        self._pending_method = h.method
        return [ExchangeStarted(exchange)]

    cdef list _response(self, bytes data, long long ts_ns, long long missing):
        """A whole final response to the exchange waiting: its end; or its head and
        the first bytes of a body that goes on in later events: no event yet (the
        reference reports none for an exchange whose progress is not observed); or
        None."""
        cdef Head h
        cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(data), body_start, in_data, kept
        cdef long long length
        cdef HttpResponse response
        cdef HttpExchange exchange = self._pending
        if exchange is None or missing < 0 or not parse_response_head(p, n, &h):
            return None
        if h.status < 200 or h.status == 101:
            return None
        body_start = h.head_len + 4
        in_data = n - body_start
        if self._pending_method == M_HEAD or h.status == 204 or h.status == 304:
            length = 0
        elif h.content_length < 0:
            return None  # no length: delimited by the close (or Transfer-Encoding, refused above)
        else:
            length = h.content_length
        if in_data + missing != length:
            if missing == 0 and in_data < length:
                return self._response_head(data, ts_ns, &h, body_start, in_data, length)
            return None  # bytes after the body, or a gap that is more than its tail
        response = HttpResponse(VERSIONS[h.minor], None, ts_ns, ts_ns, ts_ns, length, b"", missing > 0)
        response.status = h.status
        response.reason = self._reasons.get(p + h.target_off, h.target_len)
        if h.line_end < h.head_len:
            response.headers = self._response_heads.get(p, &h, self._lengths)
        if in_data and self.body_limit > 0:
            kept = in_data if in_data <= self.body_limit else self.body_limit
            response.body = data[body_start:body_start + kept]
        exchange.response = response
        self._pending = None
        self.counts.exchanges += 1
        return [ExchangeCompleted(exchange)]

    cdef list _response_head(self, bytes data, long long ts_ns, Head* h, Py_ssize_t body_start, Py_ssize_t in_data,
                             long long length):
        """A final response whose ``Content-Length`` body goes on after this event (a
        server writing its head and body apart): the exchange is answered, its body
        followed by :meth:`_response_body`, as the reference's parser would."""
        cdef HttpResponse response = HttpResponse(VERSIONS[h.minor], None, ts_ns, ts_ns, 0, in_data, b"", False)
        cdef HttpExchange exchange = self._pending
        cdef bytes kept
        response.status = h.status
        response.reason = self._reasons.get(<const unsigned char*>PyBytes_AS_STRING(data) + h.target_off, h.target_len)
        if h.line_end < h.head_len:
            response.headers = self._response_heads.get(<const unsigned char*>PyBytes_AS_STRING(data), h, self._lengths)
        self._parts = []
        self._kept = 0
        if in_data and self.body_limit > 0:
            kept = data[body_start:body_start + (in_data if in_data <= self.body_limit else self.body_limit)]
            self._parts.append(kept)
            self._kept = PyBytes_GET_SIZE(kept)
        exchange.response = response
        self._pending = None
        self._answering = exchange
        self._remaining = length - in_data
        self._last_byte_ns = ts_ns
        return []

    cdef list _response_body(self, bytes data, long long ts_ns, long long missing):
        """More of the body of the response being answered: its end once the body is
        whole, else no event; None (the reference takes over in the middle of the body)
        for a gap, bytes beyond the body, or a piece that could start a new response
        (the reference then decides whether the body was cut short)."""
        cdef Py_ssize_t n = PyBytes_GET_SIZE(data), room
        cdef HttpExchange exchange = self._answering
        cdef HttpResponse response = exchange.response
        if missing != 0 or n == 0 or n > self._remaining or (<const unsigned char*>PyBytes_AS_STRING(data))[0] == 72:
            return None  # 72: "H", as in "HTTP/1.1 200"
        room = self.body_limit - self._kept
        if room > 0:
            if n <= room:
                self._parts.append(data)
                self._kept += n
            else:
                self._parts.append(data[:room])
                self._kept += room
        response.body_size += n
        self._remaining -= n
        self._last_byte_ns = ts_ns
        if self._remaining:
            return []
        response.end_ns = ts_ns
        if self._parts:
            response.body = b"".join(self._parts)
        self._parts = None
        self._answering = None
        self.counts.exchanges += 1
        return [ExchangeCompleted(exchange)]
