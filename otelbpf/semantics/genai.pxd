# C types for genai.py when Cython compiles it (setup.py). The logic lives only in
# genai.py; this file only declares the progress filter's functions (is_llm_call runs
# once per HTTP exchange that starts), so that they and match_endpoint are C calls
# among themselves. The classes stay Python classes.
from protocols.genai.llm cimport match_endpoint


cpdef tuple request_line(exchange)
cpdef bint is_llm_call(exchange) except -1
