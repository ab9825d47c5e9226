# C types for base.py when Cython compiles it (setup.py). The logic lives only in
# base.py; this file makes the session events (several per exchange) extension types
# with a C __init__. Every field the .py declares must be here; all are objects.


cdef class ExchangeStarted:
    cdef public object exchange


cdef class ExchangeProgress:
    cdef public object exchange
    cdef public object phase
    cdef public object ts_ns
    cdef public object data


cdef class ExchangeCompleted:
    cdef public object exchange


cdef class ExchangeAbandoned:
    cdef public object exchange
