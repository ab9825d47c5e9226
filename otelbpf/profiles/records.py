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

PYF_EVAL_END = 1
PYF_SHIM = 2

PROFILE_PY_FRAMES = 64
PROFILE_STACK_BYTES = 32768
PROFILE_REGS = 21

# struct profile_info (without its py[] array)
PROFILE_INFO_HEAD = struct.Struct("<QiHBB16s21Q")
# struct py_frame
PY_FRAME = struct.Struct("<QQQ")
PROFILE_INFO_SIZE = PROFILE_INFO_HEAD.size + PROFILE_PY_FRAMES * PY_FRAME.size
# struct offcpu_end
OFFCPU_END = struct.Struct("<Q")

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


def dwarf_registers(pt_regs: tuple[int, ...]) -> list[int]:
    """The 17 x86-64 DWARF registers from the 21 words of struct pt_regs."""
    out = [0] * 17
    for word, dwarf in _X86_64_PT_REGS_TO_DWARF.items():
        out[dwarf] = pt_regs[word]
    return out


class StackSampleEvent:
    """One stack sample of a traced thread, as the kernel took it."""

    __slots__ = (
        "ts_ns", "pid", "tid", "task_id", "kind", "flags", "comm", "kernel_stack_id",
        "regs", "stack_addr", "stack", "py_frames", "switch_out_ns", "blocked_ns", "kernel_addrs", "weight",
    )  # fmt: skip

    def __init__(self, ts_ns, pid, tid, task_id, kind, flags, comm, kernel_stack_id, regs, stack_addr, stack, py_frames, switch_out_ns=0, weight=0):
        self.ts_ns = ts_ns
        self.pid = pid
        self.tid = tid
        self.task_id = task_id
        self.kind = kind
        self.flags = flags
        self.comm = comm
        self.kernel_stack_id = kernel_stack_id
        #: struct pt_regs words
        self.regs = regs
        self.stack_addr = stack_addr
        self.stack = stack
        #: (code, instr, flags) per Python frame, leaf first
        self.py_frames = py_frames
        #: off-CPU: the kernel's switch-out stamp (monotonic), the key of its OffCpuEnd
        self.switch_out_ns = switch_out_ns
        #: off-CPU: filled from the matching OffCpuEnd
        self.blocked_ns = 0
        #: kernel stack addresses, leaf first (the sampler reads them from the stack map at drain)
        self.kernel_addrs = ()
        #: PROFILE_GPU_LAUNCH: the launches this sample stands for (the header's total_len)
        self.weight = weight


class OffCpuEnd:
    """A traced thread ran again after blocking ``blocked_ns``."""

    __slots__ = ("ts_ns", "pid", "tid", "switch_out_ns", "blocked_ns")

    def __init__(self, ts_ns, pid, tid, switch_out_ns, blocked_ns):
        self.ts_ns = ts_ns
        self.pid = pid
        self.tid = tid
        self.switch_out_ns = switch_out_ns
        self.blocked_ns = blocked_ns


class ProfileRecordDecoder:
    """Raw profile-ring records -> events; malformed ones are counted."""

    def __init__(self, clock_offset_ns: int = 0) -> None:
        self.clock_offset_ns = clock_offset_ns
        self.malformed = 0

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
        if kind != EV_PROFILE or len(raw) < HEADER.size + PROFILE_INFO_SIZE + captured:
            self.malformed += 1
            return None
        return self._sample(raw, ts, switch_out, tgid, tid, captured, task_id, total)

    def _sample(self, raw: bytes, ts: int, switch_out: int, tgid: int, tid: int, captured: int, task_id: int, weight: int = 0):
        at = HEADER.size
        head = PROFILE_INFO_HEAD.unpack_from(raw, at)
        stack_addr, kernel_stack_id, py_count, kind, flags, comm = head[:6]
        regs = head[6:]
        frames_at = at + PROFILE_INFO_HEAD.size
        py_frames = [PY_FRAME.unpack_from(raw, frames_at + i * PY_FRAME.size) for i in range(min(py_count, PROFILE_PY_FRAMES))]
        stack_at = at + PROFILE_INFO_SIZE
        return StackSampleEvent(
            ts + self.clock_offset_ns, tgid, tid, task_id, kind, flags,
            comm.split(b"\0", 1)[0].decode("utf-8", "replace"), kernel_stack_id,
            regs, stack_addr, bytes(raw[stack_at : stack_at + captured]), py_frames, switch_out, weight,
        )  # fmt: skip
