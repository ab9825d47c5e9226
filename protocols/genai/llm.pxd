# C types for llm.py when Cython compiles it (setup.py). The logic lives only in llm.py;
# this file only declares match_endpoint, asked once per HTTP exchange that starts (the
# GenAI progress filter), so that otelbpf/semantics/genai.py calls it as a C function.
# The classes stay Python classes.


cpdef object match_endpoint(method, target)
