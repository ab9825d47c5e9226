# C types for grpc.py when Cython compiles it (setup.py). The logic lives only in
# grpc.py; this file types the per-span functions' arguments with the HTTP/2 extension
# types (protocols/http2/types.pxd), so that their field reads are C struct reads, and
# makes PeerMethods an extension type. Called from semantics/http2.py (which cimports
# them) these are C calls; from Python, as before.
cimport cython as cy
from protocols.http2.types cimport Http2Exchange, Http2Message


@cy.final
cdef class PeerMethods:
    cdef public object capacity
    cdef object _methods

    cpdef void remember(self, key, method) except *
    cpdef object recall(self, key)


@cy.locals(request=Http2Message, response=Http2Message)
cpdef bint is_grpc(Http2Exchange exchange) except -1
cpdef object status_name(code)
@cy.locals(request=Http2Message, response=Http2Message)
cpdef tuple grpc_attributes(Http2Exchange exchange, kind, dict attrs, dup, PeerMethods peer_methods=*, stream_key=*)
