# C types for frames.py when Cython compiles it (setup.py). The logic lives only in
# frames.py; this file makes the functions the session calls for every frame C
# functions (stitch.pxd cimports them: a direct C call, no Python call per frame), and
# read_u32's bytes C ints.


cimport cython as cy


@cy.locals(b0=cy.long, b1=cy.long, b2=cy.long, b3=cy.long)
cpdef long read_u32(data, Py_ssize_t pos) except? -1
cpdef object check_unread(frame, Py_ssize_t length, int frame_type, int flags, stream_id)
@cy.locals(length=cy.long)
cpdef tuple read_header(data, Py_ssize_t pos=*)
