# C types for queue.py when Cython compiles it (setup.py). The logic lives only in
# queue.py; this file makes BatchQueue an extension type, so that add(), called once
# per span, reads the state it needs as C fields and calls _add_to_open_batch and
# _seal_open_batch as C methods. Subclasses (BatchSpanProcessor) stay Python classes;
# attributes not declared here still work (the instance keeps a __dict__ for them).


cdef class BatchQueue:
    cdef dict __dict__
    cdef object _counters
    cdef object _make_batch
    cdef object _accept
    cdef object _names
    cdef Py_ssize_t _max_queue_size
    cdef Py_ssize_t _max_batch_size
    cdef double _schedule_delay_s
    cdef object _lock
    cdef list _open
    cdef object _open_deadline
    cdef Py_ssize_t _next_sequence
    cdef bint _closing
    cdef list _lanes

    cpdef add(self, item)
    cdef void _add_to_open_batch(self, item) except *
    cdef void _seal_open_batch(self) except *
