# C types for parse.py when Cython compiles it (setup.py). The logic lives only in
# parse.py; this file makes HttpParser an extension type whose state is C fields
# (attribute reads and writes without dictionary lookups on every byte chunk),
# its states and framings C ints, and its private steps C methods (called
# directly, not looked up and called as Python methods).
cimport cython as cy
from protocols.http1.types cimport FieldBlock, HttpMessageBase, HttpRequest, HttpResponse

cdef int _HEAD, _FIXED_BODY, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_DATA_END, _TRAILERS, _UNTIL_CLOSE, _RESYNC, _OPAQUE, _CHUNK_RESYNC
cdef int _NO_FRAMING, _LENGTH, _CHUNKED, _OTHER_CODING, _INVALID


# A reader of a body's pieces the parser hands them to (an LLM call's SSE stream): its
# methods are C calls from the parser, overridden by subclasses elsewhere
# (protocols/genai/chunks.pxd, SseTap).
cdef class BodyTap:
    cpdef begin(self, message)
    cpdef Py_ssize_t take(self, bytes data, Py_ssize_t start, Py_ssize_t stop, long long ts_ns) except -1
    cpdef object release(self)


@cy.final
cdef class HttpParser:
    cdef public str kind
    cdef public Py_ssize_t body_limit
    cdef public bint body_events
    cdef public Py_ssize_t max_head_size
    cdef public Py_ssize_t max_headers
    cdef public Py_ssize_t parse_errors
    cdef public Py_ssize_t resyncs
    cdef Py_ssize_t _resync_scanned
    cdef bint _resync_fresh
    cdef bint _is_request
    cdef object _looks_like_start
    cdef object _looks_like_restart
    cdef object _start_line_prefix
    cdef int _state
    cdef bytearray _buffer
    cdef HttpMessageBase _message
    cdef long long _head_start_ns
    cdef long long _last_byte_ns
    cdef long long _remaining
    cdef list _body_parts
    cdef Py_ssize_t _captured
    cdef list _informational
    cdef object _expected_methods
    cdef object _expected_taps

    cpdef list feed(self, data, long long ts_ns, long long missing=*)
    cpdef list close(self)
    cpdef expect_response_to(self, method, tap=*)
    cdef void _consume(self, data, long long ts_ns, list events) except *
    cdef Py_ssize_t _consume_head(self, data, Py_ssize_t pos, long long ts_ns, list events) except -1
    cdef Py_ssize_t _consume_fixed_body(self, data, Py_ssize_t pos, long long ts_ns, list events) except -1
    cdef Py_ssize_t _consume_chunk_size(self, data, Py_ssize_t pos, long long ts_ns, list events) except -1
    @cy.locals(end=Py_ssize_t, size=Py_ssize_t, after=Py_ssize_t)
    cdef Py_ssize_t _consume_chunk_size_fast(self, bytes data, Py_ssize_t pos, long long ts_ns, list events) except -2
    @cy.locals(end=Py_ssize_t, limit=Py_ssize_t, size=Py_ssize_t, i=Py_ssize_t, c=cy.int)
    cdef Py_ssize_t _short_chunk_line(self, bytes data, Py_ssize_t pos) except -1
    cdef Py_ssize_t _consume_chunk_data(self, data, Py_ssize_t pos, long long ts_ns, list events) except -1
    cdef Py_ssize_t _consume_chunk_data_end(self, data, Py_ssize_t pos, long long ts_ns, list events) except -1
    cdef Py_ssize_t _consume_trailers(self, data, Py_ssize_t pos, long long ts_ns, list events) except -1
    cdef Py_ssize_t _consume_until_close(self, data, Py_ssize_t pos, long long ts_ns, list events) except -1
    cdef tuple _take_section(self, data, Py_ssize_t pos, bytes terminator, Py_ssize_t limit, list events)
    @cy.locals(message=HttpMessageBase, tap=BodyTap, start=Py_ssize_t, room=Py_ssize_t)
    cdef void _take_body(self, data, Py_ssize_t pos, Py_ssize_t count, long long ts_ns, list events) except *
    cdef void _release_tap(self, HttpMessageBase message, list events) except *
    @cy.locals(message=HttpMessageBase, text=str, end_of_start=Py_ssize_t, start_line=str)
    cdef void _on_head(self, head, long long ts_ns, list events) except *
    @cy.locals(size=Py_ssize_t, start=Py_ssize_t, end=Py_ssize_t, colon=Py_ssize_t, name_size=Py_ssize_t, name=str)
    cdef object _fields(self, str text, Py_ssize_t first)
    @cy.locals(fields=list, line=str, name=str, colon=str, value=str)
    cdef list _parse_fields(self, list lines)
    cdef void _frame_request(self, HttpRequest request, list events) except *
    cdef void _frame_response(self, HttpResponse response, list events) except *
    @cy.locals(tap=BodyTap)
    cdef void _begin_body(self, HttpMessageBase message, int framing, long long length, list events) except *
    @cy.locals(message=HttpMessageBase)
    cdef void _finish(self, long long end_ns, list events) except *
    cdef bint _cut_short_by(self, data) except -1
    @cy.locals(first=cy.int)
    cdef bint _may_start(self, bytes data) except -1
    cdef void _drop_message_in_progress(self, list events) except *
    @cy.locals(message=HttpMessageBase)
    cdef void _abandon_message(self, list events, bint body_lost=*) except *
    cdef void _lose_sync(self, list events) except *
    cdef Py_ssize_t _consume_chunk_resync(self, data, Py_ssize_t pos, long long ts_ns, list events) except -1
    cdef void _consume_carried(self, head, long long ts_ns, list events) except *
    cdef void _chunk_resync(self, long long ts_ns, list events, bint after_gap) except *
    cdef void _skip_missing(self, long long missing, long long ts_ns, list events) except *
    @cy.locals(message=HttpMessageBase)
    cdef void _skip_body(self, long long count, long long ts_ns) except *


cdef Py_ssize_t _skip_blank_lines(data, Py_ssize_t pos) except -1
cdef bint _chunk_end_fits(bytes text, Py_ssize_t after, long long chunk, Py_ssize_t size) except -1
@cy.locals(parsed=tuple)
cdef object _new_request(str start_line)
@cy.locals(parsed=tuple)
cdef object _new_response(str start_line)
cdef tuple _remember(dict lines, str start_line, tuple parsed)
@cy.locals(parts=list, method=str, target=str, version=str)
cdef tuple _request_line(str start_line)
@cy.locals(size=Py_ssize_t)
cdef tuple _status_line(str start_line)
@cy.locals(block=FieldBlock)
cdef tuple _body_framing(object headers)
cdef bint _is_version(str text) except -1
cdef str _joined(previous, str value)
@cy.locals(digits=str)
cdef object _content_length(str value)


# The parser's events: extension types with a C __init__ (fields as in parse.py).
cdef class HeadComplete:
    cdef public object message


cdef class BodyData:
    cdef public object message
    cdef public object data
    cdef public object ts_ns


cdef class MessageComplete:
    cdef public object message
