"""Stack snapshots taken the way bpf/profile.c takes them, without BPF: the thread is
stopped with ptrace, its registers read (PTRACE_GETREGS, mapped to DWARF order) and up
to 32 KiB of its stack copied from the stack pointer through /proc/PID/mem. x86-64 only.

Used by tests/test_profiles_native.py and bench/native_unwind.py."""

from __future__ import annotations

import ctypes
import os

STACK_COPY = 32 * 1024
PTRACE_GETREGS, PTRACE_DETACH, PTRACE_SEIZE, PTRACE_INTERRUPT = 12, 17, 0x4206, 0x4207
WALL = 0x40000000
USER_REGS = (
    "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss "
    "fs_base gs_base ds es fs gs"
).split()
DWARF_ORDER = "rax rdx rcx rbx rsi rdi rbp rsp r8 r9 r10 r11 r12 r13 r14 r15 rip".split()


class UserRegs(ctypes.Structure):
    _fields_ = [(name, ctypes.c_ulonglong) for name in USER_REGS]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long


def _ptrace(request: int, tid: int, data: object = None) -> None:
    if _libc.ptrace(request, tid, None, data) == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"ptrace({request}, {tid}): {os.strerror(err)}")


def _stack_end(pid: int, sp: int) -> int:
    """End of the mapping holding ``sp``: BPF copies no further either."""
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            if start <= sp < end:
                return end
    return sp


def snapshot(pid: int, tid: int | None = None) -> tuple[list[int], int, bytes]:
    """(DWARF-ordered registers, stack address, stack copy) of a stopped thread."""
    tid = tid or pid
    _ptrace(PTRACE_SEIZE, tid)
    try:
        _ptrace(PTRACE_INTERRUPT, tid)
        os.waitpid(tid, WALL)
        regs = UserRegs()
        _ptrace(PTRACE_GETREGS, tid, ctypes.addressof(regs))
        sp = regs.rsp
        size = min(STACK_COPY, _stack_end(pid, sp) - sp)
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
            mem.seek(sp)
            stack = mem.read(size)
    finally:
        _ptrace(PTRACE_DETACH, tid)
    return [getattr(regs, name) for name in DWARF_ORDER], sp, stack
