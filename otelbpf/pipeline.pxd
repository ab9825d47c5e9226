# C types for pipeline.py when Cython compiles it (setup.py). The logic lives only in
# pipeline.py; this file makes Pipeline an extension type whose per-exchange steps are
# C methods (called directly from _session_events, not looked up as Python methods).
# Attributes not declared here still work (the instance keeps a __dict__ for them),
# only slower: declare the ones the hot path reads.
cimport cython as cy
from otelbpf.core.association cimport Linker, hold_or_release, release
from otelbpf.core.connections cimport Connection, ConnectionTable
from otelbpf.core.events cimport DataEvent
from otelbpf.core.identity cimport SpanStart
from protocols.base cimport ExchangeCompleted, ExchangeStarted


cdef class Pipeline:
    cdef dict __dict__
    cdef public object consumer
    cdef public object resources
    cdef public object counters
    cdef public object options
    cdef public object registry
    cdef public object on_new_process
    cdef public object on_process_exit
    cdef public object on_wants_bodies
    cdef public Linker linker
    cdef public ConnectionTable table
    cdef public dict progress_observers
    cdef dict _progress_wanted
    cdef dict _open
    cdef dict _semantics
    cdef Py_ssize_t _spans_built
    cdef Py_ssize_t _truncated
    cdef bint _batching
    cdef list _finished
    cdef list _reported
    cdef dict _wired
    cdef public long long last_ts_ns
    cdef dict _handlers

    cpdef _on_data(self, DataEvent event)
    @cy.locals(data_event=DataEvent)
    cdef void _start(self, Connection conn, event, exchange) except *
    cdef void _progress(self, Connection conn, item) except *
    @cy.locals(start=SpanStart, table=ConnectionTable, data_event=DataEvent)
    cdef void _end(self, Connection conn, event, exchange) except *
    cdef object _build(self, SpanStart start, exchange, Connection conn)
    cdef void _release(self, groups) except *
    cdef void _emit(self, list spans) except *
    cdef void _associate(self) except *
    @cy.locals(started=ExchangeStarted, completed=ExchangeCompleted)
    cdef void _session_events(self, Connection conn, event, list out) except *
    cdef void _deliver(self) except *
    cdef void _count_spans(self) except *
