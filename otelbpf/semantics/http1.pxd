# C types for http1.py when Cython compiles it (setup.py). The logic lives only in
# http1.py; this file makes Http1Semantics an extension type whose span() reads the
# exchange, its messages, the span's start and the connection as C struct fields
# (they are extension types: protocols/http1/types.pxd, identity.pxd, connections.pxd).
cimport cython as cy
from otelbpf.connections cimport Connection
from otelbpf.identity cimport SpanStart
from protocols.http1.types cimport HttpExchange, HttpRequest, HttpResponse


cdef class Http1Semantics:
    cdef public object genai

    @cy.locals(request=HttpRequest, response=HttpResponse, attrs=dict)
    cpdef span(self, SpanStart start, HttpExchange exchange, Connection conn, options)
