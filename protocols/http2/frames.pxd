# C types for frames.py when Cython compiles it (setup.py). The logic lives only in
# frames.py; this file makes the two functions the session calls for every frame C
# functions (stitch.pxd cimports them: a direct C call, no Python call per frame).


cpdef object check_unread(frame, Py_ssize_t length, int frame_type, int flags, stream_id)
cpdef tuple read_header(data, Py_ssize_t pos=*)
