# C types for gpu_span_consumer.py when Cython compiles it (setup.py). The logic lives only in
# gpu_span_consumer.py; this file makes GpuSpanConsumer an extension type whose on_end, run for
# every span of every protocol, reads the GpuState's fields as C struct fields (gpu_state.pxd).
# Attributes not declared here still work (the instance keeps a __dict__ for them), only slower.
cimport cython as cy

from otelbpf.semantics.gpu_state cimport GpuState


cdef class GpuSpanConsumer:
    cdef dict __dict__
    cdef public object _consumer
    cdef public GpuState state
    cdef public object _record_only
    cdef public object _consumer_on_end

    @cy.locals(state=GpuState)
    cpdef on_end(self, span)
