# C types for gpu.py when Cython compiles it (setup.py). The logic lives only in gpu.py;
# this file makes GpuState and GpuSpanConsumer extension types, so that the consumer's
# per-span check ("anything GPU pending?": six of the state's fields) reads C struct
# fields instead of six attribute look-ups, on every span of every protocol. Attributes
# not declared here still work (the instances keep a __dict__ for them), only slower.
cimport cython as cy


cdef class GpuState:
    cdef dict __dict__
    cdef public object counters
    cdef public object launches
    cdef public object deferred
    cdef public object folds
    cdef public object folded
    cdef public object entries
    cdef public object holds


cdef class GpuSpanConsumer:
    cdef dict __dict__
    cdef public object _consumer
    cdef public GpuState state
    cdef public object _record_only
    cdef public object _consumer_on_end

    @cy.locals(state=GpuState)
    cpdef on_end(self, span)
