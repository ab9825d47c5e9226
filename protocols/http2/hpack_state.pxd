# C types for hpack_state.py when Cython compiles it (setup.py). The logic lives only in
# hpack_state.py; this file makes the decoder and its result extension types, the
# decoder's private steps C methods and the module's helpers C functions. Every
# attribute the .py sets must be declared here. Integers read from the wire stay
# Python ints (an HPACK integer has no bound), so nothing can overflow.
cimport cython as cy


cdef class DecodedBlock:
    cdef public list headers
    cdef public object unknown
    cdef public object malformed


@cy.final
cdef class TolerantDecoder:
    cdef public object complete
    cdef public object max_size
    cdef object _entries
    cdef object _size
    cdef public object recoveries
    cdef dict _memo
    cdef Py_ssize_t _changes

    cdef void _changed(self) except *

    cpdef void forget(self) except *
    cpdef void set_max_size(self, size) except *
    cdef tuple _lookup(self, index)
    cdef void _add(self, name, value, decoded) except *
    cdef void _evict(self) except *
    cdef void _resize(self, size) except *
    cdef void _check_filled(self) except *
    cdef void _trust(self) except *
    @cy.locals(memo=dict, known=tuple, changes=Py_ssize_t, out=DecodedBlock)
    cpdef DecodedBlock decode(self, block)
    @cy.locals(out=DecodedBlock, pos=Py_ssize_t, end=Py_ssize_t, first=int, entry=tuple)
    cdef DecodedBlock _decode(self, block)
    @cy.locals(entry=tuple)
    cdef tuple _literal(self, data, Py_ssize_t pos, int prefix)


cpdef tuple _field(name, value)
cdef void _emit(DecodedBlock out, decoded) except *
cdef tuple _integer(data, Py_ssize_t pos, int prefix)
@cy.locals(length=object)
cdef tuple _string(data, Py_ssize_t pos)
cdef bytes _huffman(bytes raw)
