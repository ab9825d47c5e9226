# C types for genai.py when Cython compiles it (setup.py). The logic lives only in
# genai.py; this file only declares the progress filter's functions (is_llm_call runs
# once per HTTP exchange that starts), so that they are C calls among themselves and the
# routes' match() a C method call. The classes stay Python classes.
cimport cython as cy
from protocols.genai.routes cimport Routes
from protocols.http1.types cimport HttpExchange


@cy.locals(http1=HttpExchange)
cpdef tuple request_line(exchange)
@cy.locals(routes=Routes)
cpdef bint is_llm_call(exchange) except -1
