# C types for frames.py when Cython compiles it (setup.py). The logic lives only in
# frames.py; this file makes the two functions the session calls for every frame C
# functions (stitch.pxd cimports them: a direct C call, no Python call per frame), their
# bytes read into C ints.


cimport cython as cy


@cy.locals(b0=cy.long, b1=cy.long, b2=cy.long, b3=cy.long)
cpdef object check_unread(frame, Py_ssize_t length, int frame_type, int flags, stream_id)
@cy.locals(b0=cy.long, b1=cy.long, b2=cy.long, b5=cy.long, b6=cy.long, b7=cy.long, b8=cy.long,
           frame_type=cy.long, flags=cy.long, length=cy.long, stream_id=cy.long)
cpdef tuple read_header(data, Py_ssize_t pos=*)
