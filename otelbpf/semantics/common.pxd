# C types for common.py when Cython compiles it (setup.py). The logic lives only in
# common.py; this file types the per-span helpers' arguments with the extension types
# they read (SpanStart, Connection), so that their field reads are C struct reads.
# Called from compiled modules these are C calls; from Python, as before.
cimport cython as cy
from otelbpf.core.connections cimport Connection
from otelbpf.core.identity cimport SpanStart


cpdef network_transport(Connection conn, dict attrs)
cpdef peer_attributes(Connection conn, dict attrs)
cpdef http_request_extras(user_agent, body_size, dict attrs)
@cy.locals(start_ns=object, end_ns=object)
cpdef span_record(SpanStart start, exchange, name, dict attrs, status, message)
cpdef scope_name(protocol)
cpdef url_scheme(conn)
cpdef http_response_status(status, server, dict attrs)
cpdef tuple outcome_status(exchange, answered, dict attrs)
