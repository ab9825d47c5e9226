# C types for identity.py when Cython compiles it (setup.py). The logic lives only in
# identity.py; this file makes SpanStart and TraceGroup (one per request) extension types with C
# __init__s. Every field the .py declares must be here; all are objects but TraceGroup._parent
# (a TraceGroup or None) and SpanStart.group (a TraceGroup), so values behave as in plain Python.

cimport cython as cy

# TraceGroup (one per trace, built per request) is an extension type too: its parent link typed,
# so root()'s walk is C field reads; root() is a C method, and SpanStart.group typed with it, so
# that start.group.root() from a typed caller (association.pxd) is C calls and reads only.


cdef class TraceGroup:
    cdef public object _trace_id
    cdef public object _trace_state
    cdef public TraceGroup _parent
    cdef public object pending
    cdef public object held
    cdef public object wired

    @cy.locals(group=TraceGroup)
    cpdef TraceGroup root(self)


cdef class SpanStart:
    cdef public TraceGroup group
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
    cdef public object awaits_client
