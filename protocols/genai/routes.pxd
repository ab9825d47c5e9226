# C types for routes.py when Cython compiles it (setup.py). The logic lives only in
# routes.py; this file makes Routes an extension type whose match() (asked once per HTTP
# exchange that starts) otelbpf/semantics/genai.py calls as a C method.
cimport cython as cy


cdef class Routes:
    cdef public list apis
    cdef readonly dict exact
    cdef readonly dict by_key

    cpdef register(self, api)
    @cy.locals(cut=Py_ssize_t, path=str, key=str, claims=tuple)
    cpdef object match(self, method, target)
