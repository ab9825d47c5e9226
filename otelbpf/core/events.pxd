# C types for events.py when Cython compiles it (setup.py). The logic lives only in
# events.py; this file makes DataEvent (one per captured syscall) an extension type
# with a C __init__. Every field the .py declares must be here; all are objects.


cdef class DataEvent:
    cdef public object ts_ns
    cdef public object pid
    cdef public object tid
    cdef public object fd
    cdef public object conn_id
    cdef public object direction
    cdef public object total_len
    cdef public object data
    cdef public object flags
    cdef public object task_id
    cdef public object source
    cdef public object trace_ctx
