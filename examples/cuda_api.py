"""ctypes bindings of the CUDA runtime, driver and NCCL calls the examples make,
with the real libraries' signatures (the stand-ins of examples/cuda_standin
export the same), declared once for every example that calls them.

Each ``load_*`` opens one library from ``lib_dir`` and declares its argument
types; the caller keeps the handle (loading it is what a process importing
torch does: the agent finds the library in /proc/PID/maps from then on).
"""

import ctypes
import os

HERE = os.path.dirname(os.path.abspath(__file__))
#: The stand-in libraries, built by scripts/install.sh (make -C examples/cuda_standin).
DEFAULT_LIB_DIR = os.path.join(HERE, "cuda_standin", "build")

MEMCPY_HOST_TO_DEVICE, MEMCPY_DEVICE_TO_HOST = 1, 2  # cudaMemcpyKind
NCCL_FLOAT32, NCCL_SUM = 7, 0  # ncclDataType_t, ncclRedOp_t

_VOID_P, _SIZE, _INT, _UINT = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_uint


class Dim3(ctypes.Structure):
    _fields_ = [("x", _UINT), ("y", _UINT), ("z", _UINT)]


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig, the first argument of cuLaunchKernelEx."""

    _fields_ = [("dims", _UINT * 7), ("stream", _VOID_P), ("attrs", _VOID_P), ("num_attrs", _UINT)]


class UniqueId(ctypes.Structure):
    """ncclUniqueId: 128 bytes, passed by value to ncclCommInitRank."""

    _fields_ = [("internal", ctypes.c_char * 128)]


def load_runtime(lib_dir: str = DEFAULT_LIB_DIR) -> ctypes.CDLL:
    rt = ctypes.CDLL(os.path.join(lib_dir, "libcudart.so.12"))
    rt.cudaMalloc.argtypes = [ctypes.POINTER(_VOID_P), _SIZE]
    rt.cudaFree.argtypes = [_VOID_P]
    rt.cudaMemcpy.argtypes = [_VOID_P, _VOID_P, _SIZE, _INT]
    rt.cudaMemcpyAsync.argtypes = [_VOID_P, _VOID_P, _SIZE, _INT, _VOID_P]
    rt.cudaLaunchKernel.argtypes = [_VOID_P, Dim3, Dim3, _VOID_P, _SIZE, _VOID_P]
    rt.cudaStreamSynchronize.argtypes = [_VOID_P]
    rt.cudaHostAlloc.argtypes = [ctypes.POINTER(_VOID_P), _SIZE, _UINT]
    rt.cudaFreeHost.argtypes = [_VOID_P]
    return rt


def load_driver(lib_dir: str = DEFAULT_LIB_DIR) -> ctypes.CDLL:
    drv = ctypes.CDLL(os.path.join(lib_dir, "libcuda.so.1"))
    drv.cuLaunchKernel.argtypes = [_VOID_P] + [_UINT] * 7 + [_VOID_P] * 3
    drv.cuLaunchKernelEx.argtypes = [ctypes.POINTER(LaunchConfig), _VOID_P, _VOID_P, _VOID_P]
    drv.cuGraphLaunch.argtypes = [_VOID_P, _VOID_P]
    drv.cuStreamSynchronize.argtypes = [_VOID_P]
    drv.cuModuleLoadData.argtypes = [ctypes.POINTER(_VOID_P), _VOID_P]
    drv.cuModuleGetFunction.argtypes = [ctypes.POINTER(_VOID_P), _VOID_P, ctypes.c_char_p]
    drv.cuLibraryLoadData.argtypes = [ctypes.POINTER(_VOID_P), _VOID_P, _VOID_P, _VOID_P, _UINT, _VOID_P, _VOID_P, _UINT]
    drv.cuLibraryGetKernel.argtypes = [ctypes.POINTER(_VOID_P), _VOID_P, ctypes.c_char_p]
    drv.cuKernelGetFunction.argtypes = [ctypes.POINTER(_VOID_P), _VOID_P]
    return drv


def load_kernels(lib_dir: str = DEFAULT_LIB_DIR) -> ctypes.CDLL:
    """The stand-in CUDA library of examples/cuda_standin/kernels.cpp: its constructor registers its
    kernels with the runtime (libcudart, which it needs); ``standin_launch_<kernel>(n)`` launches one
    n times as C++ code's ``kernel<<<grid, block>>>(...)`` does."""
    kernels = ctypes.CDLL(os.path.join(lib_dir, "libstandin_kernels.so"))
    for name in ("standin_launch_vector_add", "standin_launch_gemm", "standin_launch_layer_norm"):
        getattr(kernels, name).argtypes = [_INT]
    return kernels


def load_nccl(lib_dir: str = DEFAULT_LIB_DIR, id_by_reference: bool = False) -> ctypes.CDLL:
    """``id_by_reference``: the stand-in built to take the ncclUniqueId by pointer,
    as an arm64 caller passes it (examples/cuda_standin/build/byref)."""
    nccl = ctypes.CDLL(os.path.join(lib_dir, "libnccl.so.2"))
    id_type = ctypes.POINTER(UniqueId) if id_by_reference else UniqueId
    nccl.ncclCommInitRank.argtypes = [ctypes.POINTER(_VOID_P), _INT, id_type, _INT]
    nccl.ncclAllReduce.argtypes = [_VOID_P, _VOID_P, _SIZE, _INT, _INT, _VOID_P, _VOID_P]
    nccl.ncclCommDestroy.argtypes = [_VOID_P]
    return nccl


def check(rc: int, what: str) -> None:
    """A CUDA or NCCL call that failed raises (the examples answer 500)."""
    if rc != 0:
        raise RuntimeError(f"{what} failed: {rc}")
