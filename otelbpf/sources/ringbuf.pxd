# C types for ringbuf.py when Cython compiles it (setup.py). The logic lives only in
# ringbuf.py; this file declares types and the three atomic accessors. drain_decoded()
# hands each record, in place, to ebpf_layout's RecordDecoder (a C call).
cimport cython as cy
from cpython.buffer cimport Py_buffer, PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE, PyBUF_WRITABLE
from cpython.bytes cimport PyBytes_FromStringAndSize
from otelbpf.sources.ebpf_layout cimport RecordDecoder

cdef extern from *:
    """
    #include <stdint.h>
    static inline unsigned long long rb_load_acquire_u64(const unsigned char *p) {
        return __atomic_load_n((const uint64_t *)p, __ATOMIC_ACQUIRE);
    }
    static inline unsigned int rb_load_acquire_u32(const unsigned char *p) {
        return __atomic_load_n((const uint32_t *)p, __ATOMIC_ACQUIRE);
    }
    static inline void rb_store_release_u64(unsigned char *p, unsigned long long v) {
        __atomic_store_n((uint64_t *)p, (uint64_t)v, __ATOMIC_RELEASE);
    }
    """
    unsigned long long rb_load_acquire_u64(const unsigned char *p) nogil
    unsigned int rb_load_acquire_u32(const unsigned char *p) nogil
    void rb_store_release_u64(unsigned char *p, unsigned long long v) nogil


@cy.final
cdef class RingBufReader:
    cdef readonly Py_ssize_t data_size
    cdef unsigned long long _mask
    cdef Py_ssize_t _page
    cdef unsigned long long _release_bytes
    cdef object _cons_map
    cdef object _prod_map
    cdef Py_buffer _cons_view
    cdef Py_buffer _prod_view
    cdef bint _viewing
    cdef unsigned char *_cons
    cdef unsigned char *_prod
    cdef unsigned char *_data

    cdef inline unsigned long long _load_producer(self) noexcept
    cdef inline unsigned long long _load_consumer(self) noexcept
    cdef inline void _store_consumer(self, unsigned long long pos) noexcept
    cdef inline unsigned int _load_len(self, unsigned long long offset) noexcept
    cdef inline bytes _copy(self, unsigned long long offset, unsigned int length)

    @cy.locals(out=list)
    cpdef list drain(self)
    @cy.locals(out=list)
    cpdef list drain_decoded(self, RecordDecoder decoder)
    cpdef Py_ssize_t skip(self) except -1
    @cy.locals(busy=cy.uint, discard=cy.uint, hdr=cy.uint, mask=cy.ulonglong, records=Py_ssize_t,
               cons=cy.ulonglong, released=cy.ulonglong, prod=cy.ulonglong,
               header=cy.uint, length=cy.uint)
    cdef Py_ssize_t _consume(self, list out, RecordDecoder decoder=*) except -1
