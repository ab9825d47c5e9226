"""The profile ring's records (bpf/profile.c, struct layouts in bpf/capture.h).

:class:`StackSampleEvent` and :class:`OffCpuEnd` are events like the
socket ones: the sampler drains the profile ring into them, the reorder
window puts them in time order among the socket events, and the pipeline
hands them to the profiler (otelbpf/profiles/profiler.py), which links each
sample to the span its thread was serving at that instant. The registers and
the stack copy stay raw bytes until then: most off-CPU samples are dropped
(blocks shorter than the minimum) before anything is unwound.
"""

from __future__ import annotations

import struct

from otelbpf.sources.ebpf_layout import HEADER

EV_PROFILE = 9
EV_OFFCPU_END = 10
#: bpf/gpu_names.c: a GPU kernel handle's name
EV_GPU_KERNEL_NAME = 12

PROFILE_ON_CPU = 0
PROFILE_OFF_CPU = 1
#: at the entry of a GPU call (bpf/calls.c CALL_STACK): ts_ns is its CallEvent's entry
PROFILE_GPU_CALL = 2
#: at 1 kernel launch in N (bpf/gpu.c): ``weight`` is N
PROFILE_GPU_LAUNCH = 3

PF_KERNEL_MODE = 1
PF_PY_NO_THREAD = 2
PF_PY_TRUNCATED = 4
PF_STACK_TRUNCATED = 8
#: PROFILE_GPU_LAUNCH: the launched handle is a CUDA graph (cuGraphLaunch)
PF_GPU_GRAPH = 16

PYF_EVAL_END = 1
PYF_SHIM = 2

PROFILE_PY_FRAMES = 64
PROFILE_STACK_BYTES = 32768
PROFILE_REGS = 21

# struct profile_info (without its py[] array)
PROFILE_INFO_HEAD = struct.Struct("<QiHBB16sQQ21Q")
# ... its fields before the registers (the registers stay bytes: the unwinder reads them as they are)
PROFILE_INFO_FIELDS = struct.Struct("<QiHBB16sQQ")
PT_REGS_SIZE = PROFILE_REGS * 8
# struct py_frame
PY_FRAME = struct.Struct("<QQQ")
PROFILE_INFO_SIZE = PROFILE_INFO_HEAD.size + PROFILE_PY_FRAMES * PY_FRAME.size
# struct offcpu_end
OFFCPU_END = struct.Struct("<Q")
# struct gpu_kernel_name (without its name[] bytes)
GPU_KERNEL_NAME = struct.Struct("<QQQB7x")
GPU_NAME_BYTES = 256
#: enum gpu_name_source
GPU_NAME_MODULE_FUNCTION = 1
GPU_NAME_LIBRARY_KERNEL = 2
GPU_NAME_KERNEL_FUNCTION = 3
GPU_NAME_REGISTERED = 4
GPU_NAME_RUNTIME_KERNEL = 5

#: x86-64 struct pt_regs word -> DWARF register number (rax rdx rcx rbx rsi rdi rbp rsp r8..r15 rip).
_X86_64_PT_REGS_TO_DWARF = {
    10: 0,  # ax
    12: 1,  # dx
    11: 2,  # cx
    5: 3,  # bx
    13: 4,  # si
    14: 5,  # di
    4: 6,  # bp
    19: 7,  # sp
    9: 8,  # r8
    8: 9,  # r9
    7: 10,  # r10
    6: 11,  # r11
    3: 12,  # r12
    2: 13,  # r13
    1: 14,  # r14
    0: 15,  # r15
    16: 16,  # ip
}


def dwarf_registers(pt_regs) -> list[int]:
    """The 17 x86-64 DWARF registers from the 21 words of struct pt_regs (ints, or its bytes)."""
    if isinstance(pt_regs, (bytes, bytearray, memoryview)):
        pt_regs = struct.unpack_from(f"<{PROFILE_REGS}Q", pt_regs)
    out = [0] * 17
    for word, dwarf in _X86_64_PT_REGS_TO_DWARF.items():
        out[dwarf] = pt_regs[word]
    return out


class StackSampleEvent:
    """One stack sample of a traced thread, as the kernel took it."""

    __slots__ = (
        "ts_ns", "pid", "tid", "task_id", "kind", "flags", "comm", "kernel_stack_id",
        "regs", "stack_addr", "stack", "py_frames", "switch_out_ns", "blocked_ns", "kernel_addrs", "weight",
        "gpu_kernel", "gpu_host_function",
    )  # fmt: skip

    def __init__(self, ts_ns, pid, tid, task_id, kind, flags, comm, kernel_stack_id, regs, stack_addr, stack, py_frames,
                 switch_out_ns=0, weight=0, gpu_kernel=0, gpu_host_function=0):  # fmt: skip
        self.ts_ns = ts_ns
        self.pid = pid
        self.tid = tid
        self.task_id = task_id
        self.kind = kind
        self.flags = flags
        self.comm = comm
        self.kernel_stack_id = kernel_stack_id
        #: struct pt_regs: its bytes as BPF copied them (the decoder's), or its 21 words
        self.regs = regs
        self.stack_addr = stack_addr
        #: the stack copy (bytes-like: the decoder's is a view of the record, not a copy)
        self.stack = stack
        #: the Python frames, leaf first: the kernel's struct py_frame records as bytes
        #: (the decoder's: 24 bytes each, see :func:`py_frame_records`), or (code, instr, flags) tuples
        self.py_frames = py_frames
        #: off-CPU: the kernel's switch-out stamp (monotonic), the key of its OffCpuEnd
        self.switch_out_ns = switch_out_ns
        #: off-CPU: filled from the matching OffCpuEnd
        self.blocked_ns = 0
        #: kernel stack addresses, leaf first (the sampler reads them from the stack map at drain)
        self.kernel_addrs = ()
        #: PROFILE_GPU_LAUNCH: the launches this sample stands for (the header's total_len)
        self.weight = weight
        #: PROFILE_GPU_LAUNCH: the handle the driver's launch was given (with PF_GPU_GRAPH a graph),
        #: and the function the runtime's launch was given (0: not through the runtime)
        self.gpu_kernel = gpu_kernel
        self.gpu_host_function = gpu_host_function


class OffCpuEnd:
    """A traced thread ran again after blocking ``blocked_ns``."""

    __slots__ = ("ts_ns", "pid", "tid", "switch_out_ns", "blocked_ns")

    def __init__(self, ts_ns, pid, tid, switch_out_ns, blocked_ns):
        self.ts_ns = ts_ns
        self.pid = pid
        self.tid = tid
        self.switch_out_ns = switch_out_ns
        self.blocked_ns = blocked_ns


class GpuKernelName:
    """What a GPU kernel handle of process ``pid`` is called (bpf/gpu_names.c): its ``name``
    (mangled, as CUDA has it), or, for an alias (``alias`` set, ``name`` empty), the handle it
    stands for. ``truncated``: the kernel copied the first GPU_NAME_BYTES - 1 bytes; the rest is
    at ``name_addr`` in the process."""

    __slots__ = ("ts_ns", "pid", "tid", "handle", "alias", "name_addr", "source", "name", "truncated")

    def __init__(self, ts_ns, pid, tid, handle, alias, name_addr, source, name, truncated=False):
        self.ts_ns = ts_ns
        self.pid = pid
        self.tid = tid
        self.handle = handle
        self.alias = alias
        self.name_addr = name_addr
        self.source = source
        self.name = name
        self.truncated = truncated


class ProfileRecordDecoder:
    """Raw profile-ring records -> events; malformed ones are counted."""

    def __init__(self, clock_offset_ns: int = 0) -> None:
        self.clock_offset_ns = clock_offset_ns
        self.malformed = 0
        #: the raw comm field -> its text (a process has few thread names)
        self._comms: dict[bytes, str] = {}

    def decode(self, raw: bytes):
        if len(raw) < HEADER.size:
            self.malformed += 1
            return None
        ts, switch_out, tgid, tid, _fd, kind, _d, _f, _s, total, captured, task_id = HEADER.unpack_from(raw)
        if kind == EV_OFFCPU_END:
            if len(raw) < HEADER.size + OFFCPU_END.size:
                self.malformed += 1
                return None
            (blocked,) = OFFCPU_END.unpack_from(raw, HEADER.size)
            return OffCpuEnd(ts + self.clock_offset_ns, tgid, tid, switch_out, blocked)
        if kind == EV_GPU_KERNEL_NAME:
            return self._kernel_name(raw, ts, tgid, tid, captured)
        if kind != EV_PROFILE or len(raw) < HEADER.size + PROFILE_INFO_SIZE + captured:
            self.malformed += 1
            return None
        return self._sample(raw, ts, switch_out, tgid, tid, captured, task_id, total)

    def _kernel_name(self, raw: bytes, ts: int, tgid: int, tid: int, captured: int):
        start = HEADER.size + GPU_KERNEL_NAME.size
        if len(raw) < start or captured >= GPU_NAME_BYTES or len(raw) < start + captured:
            self.malformed += 1
            return None
        handle, alias, name_addr, source = GPU_KERNEL_NAME.unpack_from(raw, HEADER.size)
        name = bytes(raw[start : start + captured]).decode("utf-8", "replace")
        return GpuKernelName(ts + self.clock_offset_ns, tgid, tid, handle, alias, name_addr, source, name,
                             truncated=captured == GPU_NAME_BYTES - 1)  # fmt: skip

    def _sample(self, raw: bytes, ts: int, switch_out: int, tgid: int, tid: int, captured: int, task_id: int, weight: int = 0):
        """Registers, Python frame records and the stack copy stay bytes: the unwinder and the
        stack builder read them as they are, and most of an off-CPU sample is never read."""
        at = HEADER.size
        stack_addr, kernel_stack_id, py_count, kind, flags, comm, gpu_kernel, gpu_host = PROFILE_INFO_FIELDS.unpack_from(raw, at)
        regs_at = at + PROFILE_INFO_FIELDS.size
        frames_at = at + PROFILE_INFO_HEAD.size
        py_frames = raw[frames_at : frames_at + min(py_count, PROFILE_PY_FRAMES) * PY_FRAME.size]
        stack_at = at + PROFILE_INFO_SIZE
        name = self._comms.get(comm)
        if name is None:
            if len(self._comms) >= 4096:
                self._comms.clear()
            name = self._comms[comm] = comm.split(b"\0", 1)[0].decode("utf-8", "replace")
        return StackSampleEvent(
            ts + self.clock_offset_ns, tgid, tid, task_id, kind, flags, name, kernel_stack_id,
            raw[regs_at : regs_at + PT_REGS_SIZE], stack_addr, memoryview(raw)[stack_at : stack_at + captured],
            py_frames, switch_out, weight, gpu_kernel, gpu_host,
        )  # fmt: skip


def py_frame_records(py_frames) -> list[tuple[int, int, int]]:
    """(code, instr, flags) per Python frame, leaf first, from either form of
    :attr:`StackSampleEvent.py_frames`."""
    if isinstance(py_frames, (bytes, bytearray, memoryview)):
        return list(PY_FRAME.iter_unpack(py_frames))
    return list(py_frames)
