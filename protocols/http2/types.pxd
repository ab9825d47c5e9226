# C types for types.py when Cython compiles it (setup.py). The logic lives only in
# types.py; this file makes the HTTP/2 message and exchange extension types (a C
# __init__ instead of the interpreted one a dataclass generates). Every field the .py
# declares must be here; all are objects, so values behave as in plain Python.


cdef class Http2Message:
    cdef public object headers
    cdef public object trailers
    cdef public object unknown_fields
    cdef public object start_ns
    cdef public object end_ns
    cdef public object body_size
    cdef public object body_truncated
    cdef public object grpc_messages
    cdef public object ended
    cdef public object grpc_prefix
    cdef public object grpc_left

    # typed callers (the HTTP/2 and gRPC semantics) call it as a C method
    cpdef object header(self, str name)


cdef class Http2Exchange:
    cdef public object stream_id
    cdef public object request
    cdef public object response
    cdef public object kind
    cdef public object outcome
    cdef public object protocol
    cdef public object abandoned_ns
    cdef public object reset_code
    cdef public object upgraded
    cdef public object joined_late
    cdef public object reports_progress
