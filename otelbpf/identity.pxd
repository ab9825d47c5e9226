# C types for identity.py when Cython compiles it (setup.py). The logic lives only in
# identity.py; this file makes SpanStart and TraceGroup (one per request) extension types with C
# __init__s. Every field the .py declares must be here; all are objects (TraceGroup._parent a TraceGroup or None), so values
# behave as in plain Python.

# TraceGroup (one per trace, built per request) is an extension type too: its parent link typed,
# so root()'s walk is C field reads.


cdef class TraceGroup:
    cdef public object _trace_id
    cdef public object _trace_state
    cdef public TraceGroup _parent
    cdef public object pending
    cdef public object held


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
