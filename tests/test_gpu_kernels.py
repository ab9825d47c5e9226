"""GPU kernels named on the launching stack, without BPF (otelbpf/profiles/gpu_kernels.py).

Names arrive as bpf/gpu_names.c sends them (GpuKernelName events, decoded from records built
here the way the kernel lays them out); launch samples as bpf/gpu.c takes them. The order the
names are tried in, the aliases, demangling, the host stub, the unnamed handle and its counter,
then the whole path through the profiler: what reaches an exporter has the kernel on top. The
real probes are exercised by tests/test_ebpf_gpu_profiles.py.
"""

from __future__ import annotations

import ctypes
import os
import struct

from test_gpu_profiles import PID, T0, TID, Rig, of

from otelbpf.core.selfmetrics import Counters
from otelbpf.profiles import gpu_kernels
from otelbpf.profiles.gpu_kernels import KernelFrames, demangle, kernel_of_stub
from otelbpf.profiles.model import FRAME_CUDA, FRAME_NATIVE, Frame
from otelbpf.profiles.records import (
    EV_GPU_KERNEL_NAME,
    GPU_KERNEL_NAME,
    GPU_NAME_BYTES,
    GPU_NAME_KERNEL_FUNCTION,
    GPU_NAME_LIBRARY_KERNEL,
    GPU_NAME_MODULE_FUNCTION,
    GPU_NAME_REGISTERED,
    GPU_NAME_RUNTIME_KERNEL,
    PF_GPU_GRAPH,
    PROFILE_GPU_LAUNCH,
    GpuKernelName,
    ProfileRecordDecoder,
    StackSampleEvent,
)
from otelbpf.sources.ebpf_layout import HEADER

VECTOR_ADD = "_Z10vector_addPKfS0_Pfi"
VECTOR_ADD_NAME = "vector_add(float const*, float const*, float*, int)"
GEMM = "_Z11gemm_kernelIfLi128EEvPKT_S2_PS0_i"
GEMM_NAME = "void gemm_kernel<float, 128>(float const*, float const*, float*, int)"
STACK = (Frame(FRAME_NATIVE, "cuLaunchKernel"), Frame(FRAME_NATIVE, "cudaLaunchKernel"))


def name_record(handle, name=b"", alias=0, source=GPU_NAME_MODULE_FUNCTION, name_addr=0x1000, pid=PID) -> bytes:
    """A record as bpf/gpu_names.c submits it: header, struct gpu_kernel_name, the name bytes."""
    header = HEADER.pack(T0, 0, pid, TID, -1, EV_GPU_KERNEL_NAME, 0, 0, 0, 0, len(name), 0)
    body = GPU_KERNEL_NAME.pack(handle, alias, 0 if alias else name_addr, source)
    return header + body + name.ljust(GPU_NAME_BYTES, b"\0")


def learn(frames: KernelFrames, *records: bytes) -> None:
    decoder = ProfileRecordDecoder()
    for record in records:
        event = decoder.decode(record)
        assert isinstance(event, GpuKernelName)
        frames.on_name(event)


def launch(kernel=0, host=0, flags=0, pid=PID) -> StackSampleEvent:
    return StackSampleEvent(T0, pid, TID, 0, PROFILE_GPU_LAUNCH, flags, "worker", -1, (0,) * 21, 0, b"", b"",
                            weight=8, gpu_kernel=kernel, gpu_host_function=host)  # fmt: skip


def names_of(kernels: KernelFrames, event: StackSampleEvent, stack=STACK) -> str:
    frame = kernels.frame(event, stack)
    assert frame.kind == FRAME_CUDA
    return frame.function


def test_demangles_cxx_and_leaves_the_rest():
    assert demangle(VECTOR_ADD) == VECTOR_ADD_NAME
    assert demangle(GEMM) == GEMM_NAME
    assert demangle("triton_poi_fused_add_mul_0") == "triton_poi_fused_add_mul_0"
    assert demangle("_Znot_really_mangled(") == "_Znot_really_mangled("  # invalid: as it is
    assert demangle("vector_add(float const*, float const*, float*, int)") == VECTOR_ADD_NAME


def test_a_handle_named_by_the_driver_is_the_kernel_frame():
    kernels = KernelFrames(counters=Counters())
    learn(kernels, name_record(0xA0, VECTOR_ADD.encode(), source=GPU_NAME_LIBRARY_KERNEL),
          name_record(0xB0, b"triton_poi_fused_add_mul_0", source=GPU_NAME_MODULE_FUNCTION))  # fmt: skip
    assert names_of(kernels, launch(0xA0, host=0x5000)) == "GPU: " + VECTOR_ADD_NAME
    assert names_of(kernels, launch(0xB0)) == "GPU: triton_poi_fused_add_mul_0"
    assert kernels.counts["handle"] == 2
    assert kernels.counters.get("otelbpf.profiles.gpu.kernel_frames", label="handle") == 2
    # another process's handles are its own
    assert names_of(kernels, launch(0xA0, pid=PID + 1)) == "GPU: [kernel 0xa0]"


def test_aliases_lead_to_the_name_and_a_loop_ends():
    kernels = KernelFrames()
    learn(kernels, name_record(0xA0, GEMM.encode(), source=GPU_NAME_LIBRARY_KERNEL),
          name_record(0xF0, alias=0xA0, source=GPU_NAME_KERNEL_FUNCTION),  # cuKernelGetFunction: a function of the kernel
          name_record(0x11, alias=0x12, source=GPU_NAME_KERNEL_FUNCTION), name_record(0x12, alias=0x11))  # fmt: skip
    assert names_of(kernels, launch(0xF0)) == "GPU: " + GEMM_NAME
    assert names_of(kernels, launch(0x11)) == "GPU: [kernel 0x11]"  # a loop in bad data: unnamed, not stuck


def test_the_runtime_function_when_the_handle_is_unknown():
    """Registered host function (nvcc's constructor seen), CUDA 13's cudaKernel_t standing for one."""
    kernels = KernelFrames()
    learn(kernels, name_record(0x4000, VECTOR_ADD.encode(), source=GPU_NAME_REGISTERED),
          name_record(0x9000, alias=0x4000, source=GPU_NAME_RUNTIME_KERNEL))  # fmt: skip
    assert names_of(kernels, launch(0xDEAD, host=0x4000)) == "GPU: " + VECTOR_ADD_NAME
    assert names_of(kernels, launch(0xDEAD, host=0x9000)) == "GPU: " + VECTOR_ADD_NAME
    assert kernels.counts["registered"] == 2


def test_the_host_functions_symbol_only_where_it_is_code():
    """The symbol at the runtime function's address names the kernel where that address is code
    (a host function); an address in data (CUDA 13's cudaKernel_t) is never named by a symbol."""
    libc = ctypes.CDLL(None)
    code = ctypes.cast(libc.free, ctypes.c_void_p).value  # an address in an executable mapping of this process
    data = ctypes.addressof(ctypes.create_string_buffer(64))  # heap
    asked = []

    def symbol_at(pid, address):
        asked.append(address)
        return VECTOR_ADD_NAME if address == code else "a_data_symbol"

    kernels = KernelFrames(symbol_at=symbol_at)
    pid = os.getpid()
    assert names_of(kernels, launch(0x1, host=code, pid=pid)) == "GPU: " + VECTOR_ADD_NAME
    assert kernels.counts["symbol"] == 1
    assert names_of(kernels, launch(0x1, host=data, pid=pid)) == "GPU: [kernel 0x1]"
    assert asked == [code]  # data is not looked up
    names_of(kernels, launch(0x1, host=code, pid=pid))
    assert asked == [code]  # remembered


def test_the_host_stub_on_the_stack():
    stack = (Frame(FRAME_NATIVE, "cuLaunchKernel"), Frame(FRAME_NATIVE, "cudaLaunchKernel"),
             Frame(FRAME_NATIVE, "__device_stub__Z10layer_normPfi(float*, int)"), Frame(FRAME_NATIVE, "layer_norm(float*, int)"))  # fmt: skip
    assert kernel_of_stub(stack) == "layer_norm(float*, int)"
    assert kernel_of_stub(STACK) is None
    kernels = KernelFrames()
    assert names_of(kernels, launch(0x77, host=0x9999), stack) == "GPU: layer_norm(float*, int)"
    assert kernels.counts["stub"] == 1


def test_unnamed_kernels_show_their_handle_and_are_counted_graphs_are_graphs():
    counters = Counters()
    kernels = KernelFrames(counters=counters)
    frame = kernels.frame(launch(0x7F00DEAD0000), STACK)
    assert frame.function == "GPU: [kernel 0x7f00dead0000]" and frame.address == 0x7F00DEAD0000
    assert counters.get("otelbpf.profiles.gpu.kernel_frames", label="none") == 1
    assert names_of(kernels, launch(0xC0FFEE00, flags=PF_GPU_GRAPH)) == "GPU: [CUDA graph 0xc0ffee00]"
    assert counters.get("otelbpf.profiles.gpu.kernel_frames", label="graph") == 1


def test_the_kernel_goes_on_top_and_the_same_stack_is_one_object():
    kernels = KernelFrames()
    learn(kernels, name_record(0xA0, VECTOR_ADD.encode()))
    first = kernels.leaf(launch(0xA0), STACK)
    assert first[0].function == "GPU: " + VECTOR_ADD_NAME and first[1:] == STACK
    assert kernels.leaf(launch(0xA0), STACK) is first
    assert kernels.leaf(launch(0, 0), STACK) is STACK  # nothing said of what was launched: as it is
    kernels.forget(PID)
    assert kernels.leaf(launch(0xA0), STACK)[0].function == "GPU: [kernel 0xa0]"


def test_a_name_longer_than_the_kernel_copied_is_read_whole(monkeypatch):
    long_name = ("_Z" + "N" * 300 + "E").encode()
    buffer = ctypes.create_string_buffer(long_name)  # in this process, as the name is in the traced one
    kernels = KernelFrames()
    learn(kernels, name_record(0xA0, long_name[: GPU_NAME_BYTES - 1], name_addr=ctypes.addressof(buffer), pid=os.getpid()))
    assert kernels.name_of(os.getpid(), 0xA0) == long_name.decode()


def test_malformed_name_records_are_counted_not_raised():
    decoder = ProfileRecordDecoder()
    good = name_record(0xA0, VECTOR_ADD.encode())
    assert decoder.decode(good[: HEADER.size + 8]) is None
    bad_length = bytearray(good)
    struct.pack_into("<I", bad_length, HEADER.size - 12, GPU_NAME_BYTES)  # captured_len beyond the name field
    assert decoder.decode(bytes(bad_length)) is None
    assert decoder.malformed == 2
    assert decoder.decode(good).name == VECTOR_ADD


def test_through_the_profiler_the_exported_launch_has_its_kernel_on_top():
    rig = Rig()
    rig.profiler.linker.windows[(PID, TID)] = rig.request
    rig.profiler.kernels.on_name(ProfileRecordDecoder().decode(name_record(0xA0, VECTOR_ADD.encode())))
    rig.profiler.on_sample(StackSampleEvent(T0, PID, TID, 0, PROFILE_GPU_LAUNCH, 0, "worker", -1, (0,) * 21, 1, b"", [],
                                            weight=128, gpu_kernel=0xA0))  # fmt: skip
    samples = of(rig.flush(T0 + 10), "gpu_launch")
    assert len(samples) == 1 and samples[0].values == (128,)
    assert [(f.kind, f.function) for f in samples[0].frames] == [(FRAME_CUDA, "GPU: " + VECTOR_ADD_NAME), (FRAME_NATIVE, "stack1")]
    assert samples[0].span_id == rig.request.span_id
    assert rig.counters.get(gpu_kernels.KERNEL_FRAMES, label="handle") == 1
