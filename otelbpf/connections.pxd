# C types for connections.py when Cython compiles it (setup.py). The logic lives only
# in connections.py; this file makes ConnectionTable an extension type, so that the
# per-event step (_feed) is a C call. Attributes not declared here still work (the
# instance keeps a __dict__ for them), only slower.
cimport cython as cy


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
    cdef dict _by_conn_id
    cdef dict _by_pid

    cdef void _feed(self, conn, event) except *
