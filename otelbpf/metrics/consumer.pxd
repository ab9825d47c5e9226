# C types for consumer.py when Cython compiles it (setup.py). The logic lives only in
# consumer.py; this file makes MeteredProcessor an extension type, so that on_end (once
# per span) reads its two callees as C fields rather than attribute look-ups.


cdef class MeteredProcessor:
    cdef dict __dict__
    cdef public object processor
    cdef public object span_metrics
    cdef public object exporter
    cdef public object _metrics_share
    cdef public object _processor_on_end
    cdef public object _record
