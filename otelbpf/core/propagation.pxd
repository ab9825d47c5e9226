# C types for propagation.py when Cython compiles it (setup.py). The logic lives only in
# propagation.py; this file makes extract_parent, asked once per request, a C call from
# the modules that cimport it (association.pxd) instead of a Python call across modules.

cpdef object extract_parent(object headers)
