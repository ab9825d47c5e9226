# C types for wire.py when Cython compiles it (setup.py). The logic lives only in
# wire.py; this file makes FragmentCache an extension type (its tables and bounds
# C fields), so that the per-attribute lookups of every encoded span are C dict
# lookups rather than attribute and method calls.
cimport cython as cy


cdef class FragmentCache:
    cdef public dict strings
    cdef public dict ints
    cdef object _render
    cdef Py_ssize_t _per_key
    cdef Py_ssize_t _total
    cdef Py_ssize_t _max_len
    cdef Py_ssize_t _size
    cdef Py_ssize_t _overflows

    @cy.locals(strings=dict, ints=dict, values=dict, fragments=list)
    cpdef list fragments(self, attributes, list fragments)


# Once per encoded span (and link): a C call from the encoders that cimport it (export/encode.pxd).
@cy.locals(cache=FragmentCache)
cpdef bytes wire_attributes(attributes, bytes tag)
