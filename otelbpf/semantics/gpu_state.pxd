# C types for gpu_state.py when Cython compiles it (setup.py). The logic lives only in
# gpu_state.py; this file makes GpuState an extension type, so that the span consumer's
# per-span check ("anything GPU pending?": six of the state's fields) reads C struct fields
# instead of six attribute look-ups, on every span of every protocol. Attributes not
# declared here still work (the instance keeps a __dict__ for them), only slower.


cdef class GpuState:
    cdef dict __dict__
    cdef public object counters
    cdef public object launches
    cdef public object deferred
    cdef public object folds
    cdef public object folded
    cdef public object entries
    cdef public object holds
    cdef public object instances
