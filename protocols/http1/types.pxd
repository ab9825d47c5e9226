# C types for types.py when Cython compiles it (setup.py). The logic lives only in
# types.py; this file makes the HTTP/1 messages and exchange extension types (a C
# __init__ instead of the interpreted one a dataclass generates). Every field the
# .py declares must be here; all are objects, so values behave as in plain Python.
cimport cython as cy


# A head's fields as text, split into pairs only on demand (types.py).
@cy.final
cdef class FieldBlock:
    cdef public object content_length
    cdef public object transfer_coding
    cdef str _text
    cdef object _lowered
    cdef Py_ssize_t _before
    cdef object _pairs

    @cy.locals(lowered=str)
    cdef Py_ssize_t _search(self, str pattern, Py_ssize_t start) except -2
    @cy.locals(pattern=str, found=Py_ssize_t)
    cpdef object get(self, str name)
    @cy.locals(found=Py_ssize_t, values=list)
    cpdef list get_all(self, str name)
    cpdef bint has(self, str name) except -1
    cpdef bint has_any(self, tuple names) except -1
    @cy.locals(end=Py_ssize_t)
    cdef str _value_at(self, Py_ssize_t start)
    cpdef list pairs(self)


cdef dict _LINE_STARTS
cdef str _line_start(str name)


cdef class HttpMessageBase:
    cdef public object version
    cdef public object headers
    cdef public object start_ns
    cdef public object head_end_ns
    cdef public object end_ns
    cdef public object body_size
    cdef public object body
    cdef public object body_truncated
    cdef public object complete
    cdef public object trailers
    # parse.BodyTap or None (compiled: a dataclass field without init, repr or comparison)
    cdef public object body_tap

    # Sets the fields above for every message class's __init__ (one copy of them): final,
    # so a direct C call from the subclasses' C __init__s.
    @cy.final
    cdef void _init_message(self, version, headers, start_ns, head_end_ns, end_ns, body_size, body, body_truncated,
                            complete, trailers) except *


cdef class HttpRequest(HttpMessageBase):
    cdef public object method
    cdef public object target


cdef class HttpResponse(HttpMessageBase):
    cdef public object status
    cdef public object reason
    cdef public object informational


cdef class HttpExchange:
    cdef public object request
    cdef public object response
    cdef public object kind
    cdef public object outcome
    cdef public object protocol
    cdef public object abandoned_ns
    cdef public object correlation_key
    cdef public object reports_progress
