# C types for http2.py when Cython compiles it (setup.py). The logic lives only in
# http2.py; this file makes Http2Semantics an extension type whose span() reads the
# exchange, its messages, the span's start and the connection as C struct fields
# (extension types: protocols/http2/types.pxd, identity.pxd, connections.pxd), and
# calls the shared helpers as C functions, as semantics/http1.pxd does for HTTP/1.
cimport cython as cy
from otelbpf.core.association cimport pair_key
from otelbpf.core.connections cimport Connection
from otelbpf.core.identity cimport SpanStart
from otelbpf.semantics.common cimport (
    http_request_extras,
    http_response_status,
    network_transport,
    outcome_status,
    peer_attributes,
    span_record,
)
from otelbpf.semantics.grpc cimport PeerMethods, grpc_attributes, is_grpc
from otelbpf.semantics.http1 cimport derive_route, split_host, split_target
from protocols.http2.types cimport Http2Exchange, Http2Message


cdef class Http2Semantics:
    cdef public object rpc_dup
    cdef public PeerMethods peer_methods
    cdef public object genai

    @cy.locals(request=Http2Message, response=Http2Message, attrs=dict)
    cpdef span(self, SpanStart start, Http2Exchange exchange, Connection conn, options)
    @staticmethod
    @cy.locals(request=Http2Message, response=Http2Message)
    cdef tuple _http_attributes(Http2Exchange exchange, bint server, authority, options, dict attrs)
