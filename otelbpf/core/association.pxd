# C types for association.py when Cython compiles it (setup.py). The logic lives only in
# association.py; this file makes Linker an extension type whose per-request steps are C
# methods, with the spans' identities (SpanStart, TraceGroup: identity.pxd) and the
# connection (connections.pxd) typed, so that their field reads and writes are C struct
# accesses. Exchanges stay untyped: any protocol's will do. Attributes not declared here
# still work (the instance keeps a __dict__ for them), only slower.
cimport cython as cy
from otelbpf.core.connections cimport Connection
from otelbpf.core.identity cimport SpanStart, TraceGroup
from otelbpf.core.model cimport SpanRecord, new_span_id, new_trace_id
from otelbpf.core.propagation cimport extract_parent


cdef class _ProcessState:
    cdef public dict by_thread
    cdef public Py_ssize_t open_count
    cdef public object background
    cdef public list task_calls


cdef class Linker:
    cdef dict __dict__
    cdef public object counters
    cdef public dict _processes
    cdef public dict _pending_clients
    cdef public Py_ssize_t _pending_count
    cdef public dict _client_keys
    cdef public dict _orphan_servers
    cdef public Py_ssize_t _task_decisions
    cdef public dict _task_call_done
    cdef public object _sent_messages
    cdef public object _unsent_messages
    cdef public list window_observers
    cdef public list answer_observers

    @cy.locals(start=SpanStart)
    cpdef SpanStart start(self, Connection conn, exchange, kind, pid, tid, ts_ns, task_id=*, wire=*)
    @staticmethod
    cdef object _pair(Connection conn, exchange, kind)
    @cy.locals(start=SpanStart)
    cpdef SpanStart start_call(self, pid, tid, ts_ns, task_id=*, off_request=*)
    @cy.locals(client=SpanStart)
    cdef SpanStart _server_start(self, pair, kind, pid, tid, wire=*)
    @cy.locals(parent=SpanStart, start=SpanStart)
    cdef SpanStart _client_start(self, kind, pid, tid, task_id, off_request=*, wire=*)
    @cy.locals(state=_ProcessState)
    cdef void _open_window(self, SpanStart start) except *
    @cy.locals(state=_ProcessState)
    cdef _ProcessState _state(self, pid)
    cdef void _remember_client(self, key, SpanStart start) except *
    cdef object _claim_client(self, key)
    @cy.locals(server=SpanStart)
    cdef bint _adopt_orphan(self, key, SpanStart client, ts_ns) except -1
    cdef void _stop_awaiting_client(self, SpanStart server) except *
    cpdef list end(self, SpanStart start, ts_ns, task_id=*)
    @cy.locals(windows=list, state=_ProcessState)
    cdef void _close_window(self, SpanStart start) except *


cpdef tuple pair_key(Connection conn, kind)
cdef bint _remove_identical(items, target) except -1
@cy.locals(root=TraceGroup)
cpdef list hold_or_release(SpanRecord span, SpanStart start)
@cy.locals(root=TraceGroup, held=list, span=SpanRecord)
cpdef list release(TraceGroup group)
