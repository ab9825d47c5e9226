# C types for model.py when Cython compiles it (setup.py). The logic lives only in
# model.py; this file makes SpanLink and SpanRecord extension types (a C __init__
# instead of the interpreted one a dataclass generates). Every field the .py
# declares must be here; all are objects, so values behave as in plain Python.


# Drawn twice per request: C calls from the modules that cimport them (association.pxd).
cpdef bytes new_trace_id()
cpdef bytes new_span_id()
cdef bytes _draw(list pool, Py_ssize_t size, bytes zero, bytes one)


cdef class SpanLink:
    cdef public object trace_id
    cdef public object span_id
    cdef public object attributes


cdef class SpanRecord:
    cdef public object trace_id
    cdef public object span_id
    cdef public object name
    cdef public object kind
    cdef public object start_ns
    cdef public object end_ns
    cdef public object pid
    cdef public object parent_span_id
    cdef public object attributes
    cdef public object status_code
    cdef public object status_message
    cdef public object trace_state
    cdef public object links
    cdef public object scope
    cdef public object protocol
