# C types for chunks.py when Cython compiles it (setup.py). The logic lives only in
# chunks.py; this file makes SseTap, the HTTP/1 parser's reader of an SSE response, an
# extension type whose take() the parser calls as a C method, and declares the in-place
# chunk classifier it and LlmCall's events use (C loops over the chunk's bytes).
cimport cython as cy
from libc.string cimport memchr, memcmp
from protocols.http1.parse cimport BodyTap


cdef class SseTap(BodyTap):
    cdef public object call
    cdef public object layer
    cdef public object exchange
    cdef public object message
    cdef public bint active
    cdef public bint plain
    cdef public bint parsed_first
    cdef bint _checked
    cdef public Py_ssize_t chunks
    cdef public long long first_ns
    cdef public long long last_ns
    cdef public Py_ssize_t events
    cdef public bytes carry
    cdef public long long carry_ts
    cdef bytes _template
    cdef Py_ssize_t _head
    cdef Py_ssize_t _tail
    cdef int _kind

    @cy.locals(text=cy.p_uchar, template=bytes, head=Py_ssize_t, tail=Py_ssize_t, size=Py_ssize_t, string_at=Py_ssize_t,
               kind=cy.int, hit=cy.p_void, close=Py_ssize_t)
    cdef int _classify(self, bytes buf, Py_ssize_t start, Py_ssize_t end) except -2

    @cy.locals(buf=bytes, carry=bytes, pos=Py_ssize_t, end=Py_ssize_t, carried=Py_ssize_t, eol=Py_ssize_t, kind=cy.int)
    cpdef begin(self, message)
    cdef bint _bind(self) except -1
    cpdef Py_ssize_t take(self, bytes data, Py_ssize_t start, Py_ssize_t stop, long long ts_ns) except -1
    cdef void _flush(self) except *
    cpdef object release(self)


@cy.locals(avail=Py_ssize_t, text=cy.p_uchar, hit=cy.p_void, stop=Py_ssize_t, eol=Py_ssize_t)
cdef Py_ssize_t _event_end(bytes buf, Py_ssize_t pos, Py_ssize_t end) except -3
cpdef int plain_chunk_at(bytes buf, Py_ssize_t start, Py_ssize_t end) except -2
@cy.locals(seen=cy.int, output=cy.int, first_index=Py_ssize_t, q=Py_ssize_t, name=Py_ssize_t, c=cy.int, key=cy.int,
           after=Py_ssize_t, value=Py_ssize_t)
cdef int _classify_at(unsigned char *text, Py_ssize_t start, Py_ssize_t end, Py_ssize_t *string_at) noexcept
cdef bint _is_key_name(unsigned char *text, Py_ssize_t start, Py_ssize_t size) noexcept
cdef bint _key_at(unsigned char *text, Py_ssize_t name, Py_ssize_t end, const char *key, Py_ssize_t size) noexcept
cdef Py_ssize_t _value_start(unsigned char *text, Py_ssize_t pos, Py_ssize_t end) noexcept
