# C types for connections.py when Cython compiles it (setup.py). The logic lives only
# in connections.py; this file makes ConnectionTable an extension type, so that the
# per-event step (_feed) is a C call. Attributes not declared here still work (the
# instance keeps a __dict__ for them), only slower.
cimport cython as cy
from otelbpf.core.events cimport DataEvent


# One per connection, read several times per request (the pipeline, the span semantics):
# an extension type, so that callers typing it (pipeline.pxd, semantics/common.pxd) read
# its fields as C struct fields. Every attribute connections.py sets must be here.
cdef class Connection:
    cdef public object conn_id
    cdef public object pid
    cdef public object fd
    cdef public object family
    cdef public object local_addr
    cdef public object local_port
    cdef public object peer_addr
    cdef public object peer_port
    cdef public object role_hint
    cdef public object comm
    cdef public object sock_id
    cdef public object peer_sock_id
    cdef public object opened_ns
    cdef public object session
    cdef public object unrecognized
    cdef public object sendfile_ns
    cdef public object source
    cdef public object datagram
    cdef public object key
    cdef public dict exchanges
    cdef public object end_outcome
    cdef public object shed
    cdef public object wants_bodies
    cdef public object missing_bytes
    cdef public object wire_ctx
    cdef public object wire_ctx_ns
    cdef public object wire_ctx_dir
    cdef public list _probe_events
    cdef public object _parse_errors_seen


cdef class ConnectionTable:
    cdef dict __dict__
    cdef public list stream_detectors
    cdef public list datagram_detectors
    cdef public object on_events
    cdef public object on_ended
    cdef public object counters
    cdef public Py_ssize_t max_connections
    cdef public object on_unrecognized
    cdef public long long shed_permille
    cdef object _conns
    cdef object _touch
    cdef dict _by_conn_id
    cdef dict _by_pid

    @cy.locals(conn=Connection)
    cpdef data(self, DataEvent event)
    cdef void _feed(self, Connection conn, event, direction, data, ts_ns, missing) except *
