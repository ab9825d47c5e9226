# C types for http1.py when Cython compiles it (setup.py). The logic lives only in
# http1.py; this file makes Http1Semantics an extension type whose span() reads the
# exchange, its messages, the span's start and the connection as C struct fields
# (they are extension types: protocols/http1/types.pxd, identity.pxd, connections.pxd).
cimport cython as cy
from otelbpf.core.connections cimport Connection
from otelbpf.core.identity cimport SpanStart
# the shared helpers as C calls (imported, they would be Python calls across modules)
from otelbpf.semantics.common cimport (
    http_request_extras,
    http_response_status,
    network_transport,
    outcome_status,
    peer_attributes,
    span_record,
    url_scheme,
)
from protocols.http1.types cimport FieldBlock, HttpExchange, HttpRequest, HttpResponse


cdef class Http1Semantics:
    cdef public object genai

    @cy.locals(request=HttpRequest, response=HttpResponse, attrs=dict)
    cpdef span(self, SpanStart start, HttpExchange exchange, Connection conn, options)
    @staticmethod
    cdef object _server_attributes(method, path, query, host_header, Connection conn, options, dict attrs)
    @staticmethod
    cdef object _client_attributes(method, path, query, host_header, Connection conn, options, dict attrs)


# Module helpers called per span: C calls from span(), Python functions still (http2.py
# imports some).
cpdef derive_route(path)
cdef object _remember(dict table, key, Py_ssize_t size, value)
cpdef tuple split_target(target)
cdef tuple _split_target(target)
@cy.locals(block=FieldBlock)
cpdef tuple _host_and_user_agent(headers)
cpdef tuple split_host(host, default_port)
cdef tuple _split_host(host, default_port)
