# C types for identity.py when Cython compiles it (setup.py). The logic lives only in
# identity.py; this file makes SpanStart (one per request) an extension type with a C
# __init__. Every field the .py declares must be here; all are objects, so values
# behave as in plain Python.


cdef class SpanStart:
    cdef public object group
    cdef public object span_id
    cdef public object parent_span_id
    cdef public object kind
    cdef public object pid
    cdef public object tid
    cdef public object association
    cdef public object task_id
    cdef public object start_ns
    cdef public object links
    cdef public object span
