# C types for histograms.py when Cython compiles it (setup.py). The logic lives only in
# histograms.py; this file types the series-key helper that SpanMetrics.record calls once
# per measured span, so that its lookups are C dict lookups (a C call, not a Python one),
# and makes SpanMetrics and its per-process slot extension types, so that record() reads
# its tables as C fields. The span itself stays untyped: record() never raises, whatever
# it is given. Attributes not declared here still work (SpanMetrics keeps a __dict__).
cimport cython as cy

cpdef tuple _dict_key(dict attributes, tuple keys)


cdef class _Process:
    cdef public object pid
    cdef public object resource
    cdef public list tables


cdef class SpanMetrics:
    cdef dict __dict__
    cdef public list _instruments
    cdef public dict _by_protocol
    cdef public object _lookup
    cdef public object _max_series
    cdef public object _ttl_s
    cdef public object _lock
    cdef public dict _processes
    cdef public list _retired
    cdef public object _series
    cdef public object _overflowed
    cdef public object _errors_logged

    @cy.locals(by_kind=dict, measurements=list, process=_Process, tables=list, table=dict, series=list)
    cpdef record(self, span)
