# C types for genai.py when Cython compiles it (setup.py). The logic lives only in
# genai.py; this file only declares the progress filter's functions (is_llm_call runs
# once per HTTP exchange that starts), so that they and match_endpoint are C calls
# among themselves. The classes stay Python classes.
cimport cython as cy
from protocols.genai.llm cimport match_endpoint
from protocols.http1.types cimport HttpExchange


@cy.locals(http1=HttpExchange)
cpdef tuple request_line(exchange)
cpdef bint is_llm_call(exchange) except -1
