# C types for parse.py when Cython compiles it (setup.py). The logic lives only in
# parse.py; this file makes HttpParser an extension type whose state is C fields
# (attribute reads and writes without dictionary lookups on every byte chunk).
cimport cython as cy


@cy.final
cdef class HttpParser:
    cdef public str kind
    cdef public Py_ssize_t body_limit
    cdef public Py_ssize_t max_head_size
    cdef public Py_ssize_t max_headers
    cdef public Py_ssize_t parse_errors
    cdef bint _is_request
    cdef object _looks_like_start
    cdef object _looks_like_restart
    cdef object _start_line_prefix
    cdef object _state
    cdef bytearray _buffer
    cdef object _message
    cdef long long _head_start_ns
    cdef long long _last_byte_ns
    cdef long long _remaining
    cdef list _body_parts
    cdef Py_ssize_t _captured
    cdef list _informational
    cdef object _expected_methods
