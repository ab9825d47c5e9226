# C types for ebpf_layout.py when Cython compiles it (setup.py). The logic lives
# only in ebpf_layout.py. RecordDecoder becomes an extension type whose decode_at()
# reads a record's header (struct event_hdr, bpf/capture.h) as a C struct at the
# record's start, instead of building a 12-int tuple with struct.unpack_from per
# record, wherever the record is: a bytes object, or the ring buffer's memory
# (RingBufReader.drain_decoded). The field order and widths here are HEADER's
# ("<QQIIiBBBBIIQ", 48 bytes, no padding); ebpf_layout.py checks sizeof against
# HEADER.size at import, and tests/test_ebpf_record_abi.py checks HEADER against
# capture.h compiled by the C compiler.
cimport cython as cy
from cpython.bytes cimport PyBytes_FromStringAndSize
from otelbpf.core.events cimport DataEvent

cdef struct EventHeader:
    unsigned long long ts_ns
    unsigned long long conn_id
    unsigned int tgid
    unsigned int tid
    int fd
    unsigned char kind
    unsigned char direction
    unsigned char flags
    unsigned char source
    unsigned int total_len
    unsigned int captured_len
    unsigned long long task_id

ctypedef EventHeader *EventHeaderPtr


cdef class RecordDecoder:
    cdef public object clock_offset_ns
    cdef public Py_ssize_t malformed
    cdef public dict probe_names

    @cy.locals(out=list, header_size=Py_ssize_t, start=cy.p_char)
    cpdef list decode(self, records)
    # a record in place: a bytes' buffer, or the ring buffer's memory (ringbuf.pxd cimports this)
    @cy.locals(header_size=Py_ssize_t, header=EventHeaderPtr, captured=Py_ssize_t, event=DataEvent, kind=cy.int)
    cdef void decode_at(self, const unsigned char *record, Py_ssize_t size, raw, list out) except *
    @cy.locals(header_size=Py_ssize_t)
    cdef void _decode_other(self, raw, int kind, ts, conn_id, tgid, tid, fd, direction, flags, source, total,
                            captured, task_id, list out) except *
