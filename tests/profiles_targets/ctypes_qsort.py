"""Python -> libc qsort (through ctypes) -> a Python comparison callback that burns CPU.

The stack of a sample in py_cmp crosses the interpreter twice: py_cmp (Python),
the ctypes/libffi closure frames, qsort (libc), the ctypes call frames, then
sort_with_callback (Python) and <module>.
"""

import ctypes

libc = ctypes.CDLL("libc.so.6")
CMP = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))
libc.qsort.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, CMP]
libc.qsort.restype = None


def py_cmp(a, b):
    x = 0
    for _ in range(3000):
        x += 1
    return a[0] - b[0]


COMPARE = CMP(py_cmp)


def sort_with_callback():
    values = (ctypes.c_int * 500)(*range(500, 0, -1))
    libc.qsort(values, len(values), ctypes.sizeof(ctypes.c_int), COMPARE)


print("ready", flush=True)
while True:
    sort_with_callback()
