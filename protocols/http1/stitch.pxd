# C types for stitch.py when Cython compiles it (setup.py). The logic lives only in
# stitch.py; this file makes Http1Session an extension type with C fields, and its
# private steps C methods (called directly, not as Python methods).
cimport cython as cy
from protocols.http1.parse cimport HttpParser
from protocols.http1.types cimport HttpExchange, HttpRequest, HttpResponse


@cy.final
cdef class Http1Session:
    cdef public object request_direction
    cdef public bint progress
    cdef public object progress_filter
    cdef public object kind
    cdef public Py_ssize_t max_pending
    cdef HttpParser _requests
    cdef HttpParser _responses
    cdef object _pending
    cdef HttpExchange _answering
    cdef HttpExchange _requesting
    cdef Py_ssize_t _stitch_errors
    cdef bint _tunnelled

    @cy.locals(exchange=HttpExchange)
    cdef void _on_request_events(self, list events, long long ts_ns, list out) except *
    @cy.locals(exchange=HttpExchange)
    cdef void _start_exchange(self, HttpRequest request, long long ts_ns, list out) except *
    @cy.locals(answering=HttpExchange, response=HttpResponse)
    cdef void _on_response_events(self, list events, list out, closed_ns=*) except *
    cdef void _answer_oldest(self, HttpResponse response) except *
    @cy.locals(answering=HttpExchange, exchange=HttpExchange)
    cdef bint _response_pieces_wanted(self) except -1
