"""The CUDA and NCCL functions the agent traces, and where their arguments are.

One catalogue for everyone who needs to know a GPU call by name: the probes
(otelbpf/sources/gpu.py attaches to these functions and reads these
arguments), the call spans (otelbpf/semantics/gpu_calls.py decodes them into
attributes), the engine steps (a synchronisation ends a step) and the GPU
profiles (which calls take a stack). Each table maps a function to the
indices of its arguments in the argument registers the probe read (x86-64 /
arm64 calling convention: the first six integer arguments; a struct passed
by value on the stack, like ``ncclUniqueId``, takes no register).
"""

from __future__ import annotations

import os
import platform

from otelbpf import semconv as sc

#: cudaMemcpyKind / the direction a driver copy function names.
MEMCPY_KINDS = {0: "host_to_host", 1: "host_to_device", 2: "device_to_host", 3: "device_to_device", 4: "default"}

#: ncclDataType_t -> (name, bytes per element) (nccl.h).
NCCL_DATATYPES = {
    0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8), 5: ("uint64", 8),
    6: ("float16", 2), 7: ("float32", 4), 8: ("float64", 8), 9: ("bfloat16", 2), 10: ("float8e4m3", 1),
    11: ("float8e5m2", 1),
}
#: ncclRedOp_t built-in reductions.
NCCL_REDUCE_OPS = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}

# -- CUDA -------------------------------------------------------------------------------------

#: function -> (index of dst, index of src, index of byte count, kind or index of kind arg as ("arg", i), stream index or None)
CUDA_COPIES: dict[str, tuple[int, int, int, object, int | None]] = {
    "cudaMemcpy": (0, 1, 2, ("arg", 3), None),
    "cudaMemcpyAsync": (0, 1, 2, ("arg", 3), 4),
    "cuMemcpy": (0, 1, 2, 4, None),
    "cuMemcpyAsync": (0, 1, 2, 4, 3),
    "cuMemcpyHtoD_v2": (0, 1, 2, 1, None),
    "cuMemcpyDtoH_v2": (0, 1, 2, 2, None),
    "cuMemcpyDtoD_v2": (0, 1, 2, 3, None),
    "cuMemcpyHtoDAsync_v2": (0, 1, 2, 1, 3),
    "cuMemcpyDtoHAsync_v2": (0, 1, 2, 2, 3),
    "cuMemcpyDtoDAsync_v2": (0, 1, 2, 3, 3),
}
#: allocations: function -> (size index, stream index or None); the address is the out-pointer (CallEvent.out0)
CUDA_DEVICE_ALLOCS = {"cudaMalloc": (1, None), "cudaMallocAsync": (1, 2), "cuMemAlloc_v2": (1, None),
                      "cuMemAllocAsync": (1, 2), "cuMemCreate": (1, None), "cudaMallocManaged": (1, None),
                      "cuMemAllocManaged": (1, None)}
#: frees: function -> stream index or None; the address (or handle) is the first argument
CUDA_DEVICE_FREES = {"cudaFree": None, "cudaFreeAsync": 1, "cuMemFree_v2": None, "cuMemFreeAsync": 1,
                     "cuMemRelease": None}
#: pinning with an out-pointer: function -> size index
CUDA_HOST_ALLOCS = {"cudaHostAlloc": 1, "cudaMallocHost": 1, "cuMemHostAlloc": 1, "cuMemAllocHost_v2": 1}
#: pinning existing memory: function -> (address index, size index)
CUDA_HOST_REGISTERS = {"cudaHostRegister": (0, 1), "cuMemHostRegister_v2": (0, 1)}
#: unpinning: the address is the first argument
CUDA_HOST_FREES = {"cudaFreeHost", "cuMemFreeHost", "cudaHostUnregister", "cuMemHostUnregister"}
#: synchronisations: function -> stream index or None
CUDA_SYNCS = {"cudaDeviceSynchronize": None, "cudaStreamSynchronize": 0, "cudaEventSynchronize": None,
              "cuCtxSynchronize": None, "cuStreamSynchronize": 0, "cuEventSynchronize": None}

#: Copies that return only when the transfer is done (no Async): the thread waits for the GPU.
CUDA_BLOCKING_COPIES = frozenset(name for name in CUDA_COPIES if "Async" not in name)

#: Every CUDA function the spans know (otelbpf/sources/gpu.py probes these).
CUDA_FUNCTIONS = tuple(CUDA_COPIES) + tuple(CUDA_DEVICE_ALLOCS) + tuple(CUDA_DEVICE_FREES) + tuple(
    CUDA_HOST_ALLOCS
) + tuple(CUDA_HOST_REGISTERS) + tuple(sorted(CUDA_HOST_FREES)) + tuple(CUDA_SYNCS) + ("cuMemMap", "cuMemUnmap")
#: Those whose first argument is an out-pointer to read at return.
CUDA_OUT_POINTER_FUNCTIONS = tuple(CUDA_DEVICE_ALLOCS) + tuple(CUDA_HOST_ALLOCS)
#: GPU profiles (otelbpf/profiles/gpu.py): the calls that take a stack at entry (bpf/calls.c
#: CALL_STACK): allocations, pinning, copies, synchronisations. Frees and mappings take none
#: (they are matched to their allocation by address or handle).
CUDA_STACK_FUNCTIONS = frozenset(CUDA_DEVICE_ALLOCS) | frozenset(CUDA_HOST_ALLOCS) | frozenset(
    CUDA_HOST_REGISTERS
) | frozenset(CUDA_COPIES) | frozenset(CUDA_SYNCS)

# -- NCCL -------------------------------------------------------------------------------------

#: collective -> (count index, datatype index, reduce-op index, root/peer (attribute, index), communicator index)
NCCL_COLLECTIVES: dict[str, tuple[int, int, int | None, tuple[str, int] | None, int | None]] = {
    "ncclAllReduce": (2, 3, 4, None, 5),
    "ncclAllGather": (2, 3, None, None, 4),
    "ncclReduceScatter": (2, 3, 4, None, 5),
    "ncclBroadcast": (2, 3, None, (sc.OTELBPF_NCCL_ROOT, 4), 5),
    "ncclReduce": (2, 3, 4, (sc.OTELBPF_NCCL_ROOT, 5), None),  # comm is the 7th argument: on the stack
    "ncclSend": (1, 2, None, (sc.OTELBPF_NCCL_PEER, 3), 4),
    "ncclRecv": (1, 2, None, (sc.OTELBPF_NCCL_PEER, 3), 4),
}
#: NCCL's function index (ncclFunc_t: the order of RAS's per-function counts), then send and receive;
#: the kernel counts each collective's calls per communicator handle under it (bpf/calls.c comm_seqs).
NCCL_FUNCTION_INDEX = {"ncclBroadcast": 0, "ncclReduce": 1, "ncclAllGather": 2, "ncclReduceScatter": 3,
                       "ncclAllReduce": 4, "ncclSend": 5, "ncclRecv": 6}
#: The collectives every rank of a communicator makes in the same order: those whose instances
#: are joined across ranks (send and receive pair two ranks only).
NCCL_ORDERED_COLLECTIVES = frozenset(("ncclBroadcast", "ncclReduce", "ncclAllGather", "ncclReduceScatter", "ncclAllReduce"))
#: communicator set-up: (comm**, int nranks, ncclUniqueId by value (128 bytes: on the stack), int rank, ...)
NCCL_COMM_INITS = ("ncclCommInitRank", "ncclCommInitRankConfig")
NCCL_FUNCTIONS = tuple(NCCL_COLLECTIVES) + NCCL_COMM_INITS + ("ncclCommDestroy",)
NCCL_OUT_POINTER_FUNCTIONS = NCCL_COMM_INITS
#: GPU profiles: the collectives take a stack at entry (time inside them: the wait profile).
NCCL_STACK_FUNCTIONS = frozenset(NCCL_COLLECTIVES)

#: Where ncclCommInitRank(comm*, nranks, ncclUniqueId id, rank)'s rank is, per machine: the
#: 128-byte id takes no register on x86-64 (System V: copied onto the stack, so the rank is the
#: third integer argument register, rdx) but one on arm64 (AAPCS64: a composite over 16 bytes
#: is passed by reference to a caller's copy: x2 holds the pointer, the rank is in x3). Either
#: way the probe puts the id's first 16 bytes in args[4..5] (otelbpf/sources/gpu.py NCCL_ID_FLAGS).
NCCL_RANK_REGISTERS = {"x86_64": 2, "aarch64": 3}


def nccl_abi() -> str:
    """The machine whose calling convention ncclCommInitRank is decoded by: this one, or
    OTELBPF_NCCL_ID_ABI (tests: ``aarch64`` on x86-64 against the stand-in NCCL built to take the
    id by reference, whose registers then hold what an arm64 caller's would)."""
    return os.environ.get("OTELBPF_NCCL_ID_ABI") or platform.machine()


_NCCL_ABI = nccl_abi()


def decode_comm_init(args: tuple[int, ...], machine: str | None = None) -> tuple[int, int, str]:
    """(nranks, rank, unique id hex or "") of an ncclCommInitRank(Config) call's argument words
    as the probe read them on ``machine`` (default: this one)."""
    machine = machine or _NCCL_ABI
    args = tuple(args) + (0,) * (6 - len(args))
    rank = as_c_int(args[NCCL_RANK_REGISTERS.get(machine, 2)])
    unique_id = ""
    if machine in NCCL_RANK_REGISTERS:
        unique_id = (args[4].to_bytes(8, "little") + args[5].to_bytes(8, "little")).hex()
    return as_c_int(args[1]), rank, unique_id


def as_c_int(value: int) -> int:
    """A C ``int`` (an argument, a return code) from a 64-bit register."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value
