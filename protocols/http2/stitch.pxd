# C types for stitch.py when Cython compiles it (setup.py). The logic lives only in
# stitch.py; this file makes Http2Session and its per-direction state extension types
# with C fields, and the session's private steps C methods (called directly, not as
# Python methods). Every attribute the .py sets must be declared here.
cimport cython as cy
from protocols.http2.frames cimport check_unread, read_header, read_u32
from protocols.http2.hpack_state cimport DecodedBlock, TolerantDecoder
from protocols.http2.types cimport Http2Exchange, Http2Message


@cy.final
cdef class _Side:
    cdef public bytearray buf
    cdef public TolerantDecoder decoder
    cdef public bint started
    cdef public Py_ssize_t data_left
    cdef public object data_stream
    cdef public object data_flags
    cdef public bint desynced
    cdef public object block
    cdef public object lost_ns


@cy.final
cdef class Http2Session:
    cdef public object progress
    cdef public object progress_filter
    cdef public object max_open
    cdef public object client_direction
    cdef dict _sides
    cdef dict _streams
    cdef dict _lost_streams
    cdef object _lost_floor
    cdef object _highest_stream
    cdef Py_ssize_t _errors
    cdef public object joined_late
    cdef bint _blocks_seen
    cdef public Py_ssize_t desyncs
    cdef object _upgrade
    cdef bint _fed
    cdef object _fallback

    cdef void _feed_frames(self, direction, data, ts_ns, Py_ssize_t missing, list out) except *
    cdef bint _first_bytes(self, direction, _Side side) except -1
    @cy.locals(buf=bytearray, length=Py_ssize_t, frame_type=int, flags=int, end=Py_ssize_t, take=Py_ssize_t)
    cdef void _drain(self, direction, _Side side, ts_ns, list out) except *
    @cy.locals(take=Py_ssize_t)
    cdef void _skip_missing(self, direction, _Side side, Py_ssize_t missing, ts_ns, list out) except *
    cdef void _control_frame(self, direction, _Side side, bytes raw, ts_ns, list out) except *
    @cy.locals(block=list)
    cdef void _header_fragment(self, direction, _Side side, int frame_type, int flags, stream_id, fragment, ts_ns,
                               list out) except *
    @cy.locals(decoded=DecodedBlock)
    cdef void _block_done(self, direction, _Side side, ts_ns, list out) except *
    @cy.locals(exchange=Http2Exchange, message=Http2Message, request=Http2Message)
    cdef void _request_block(self, stream_id, DecodedBlock decoded, names, bint end_stream, ts_ns, list out) except *
    cdef void _open(self, Http2Exchange exchange, ts_ns, list out) except *
    @cy.locals(client_side=_Side)
    cdef void _note_lost_streams(self, stream_id) except *
    @cy.locals(client_side=_Side, request=Http2Message, exchange=Http2Exchange)
    cdef object _lost_request(self, stream_id, ts_ns, list out)
    @cy.locals(exchange=Http2Exchange, response=Http2Message)
    cdef void _response_block(self, stream_id, DecodedBlock decoded, names, bint end_stream, ts_ns, list out) except *
    cdef void _complete(self, Http2Exchange exchange, ts_ns, list out) except *
    @cy.locals(exchange=Http2Exchange)
    cdef tuple _message(self, direction, stream_id)
    @cy.locals(exchange=Http2Exchange, message=Http2Message)
    cdef void _on_data(self, direction, stream_id, Py_ssize_t size, chunk, ts_ns, list out) except *
    @cy.locals(exchange=Http2Exchange, message=Http2Message)
    cdef void _data_frame_done(self, direction, _Side side, ts_ns, list out) except *
    cdef void _mark_padded(self, direction, stream_id) except *
    @cy.locals(exchange=Http2Exchange)
    cdef void _on_reset(self, stream_id, code, ts_ns, list out) except *
    @cy.locals(exchange=Http2Exchange)
    cdef void _on_goaway(self, direction, last_stream_id, code, ts_ns, list out) except *
    cdef list _feed_upgrade(self, direction, data, ts_ns, Py_ssize_t missing, list out)
    cdef list _decline(self, list out)
    @cy.locals(side=_Side, request=Http2Message, exchange=Http2Exchange)
    cdef list _switch(self, upgrade, ts_ns, list out)


@cy.locals(pos=Py_ssize_t, need=Py_ssize_t, take=Py_ssize_t, flag=cy.long, length=cy.long)
cdef void _count_grpc(Http2Message message, Py_ssize_t size, chunk) except *
cdef str _status(list headers)
