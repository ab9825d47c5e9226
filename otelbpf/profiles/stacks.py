"""One stack per sample: kernel frames, native frames and Python frames merged.

The kernel gives three partial views of a sampled thread (bpf/profile.c):
the kernel stack (when the sample was in the kernel), a copy of the user
stack with the registers (unwound here by DWARF CFI, otelbpf/profiles/native)
and the CPython frame chain (named here, otelbpf/profiles/python). They are
merged leaf first:

    kernel frames ... native frames ... [Python frames of each eval call] ...

Each native ``_PyEval_EvalFrameDefault`` frame is replaced by the Python
frames that evaluation call ran, so Python -> C extension -> Python callback
-> C reads as one chain. When the native unwind stopped early (no CFI, a
truncated copy), its marker frame stays where it stopped and the Python
frames not yet placed follow it: Python frames are always complete from the
kernel, a native caller is never guessed.
"""

from __future__ import annotations

import logging

from otelbpf.profiles.model import FRAME_KERNEL, FRAME_MARKER, Frame
from otelbpf.profiles.records import PF_PY_TRUNCATED, StackSampleEvent, dwarf_registers

log = logging.getLogger("otelbpf.profiles")

#: The Python frames of a process whose interpreter the agent could not read.
_PY_TRUNCATED = Frame(FRAME_MARKER, "[python frames truncated]")
_NO_NATIVE = Frame(FRAME_MARKER, "[native frames unavailable]")
#: Bound on remembered kernel symbols (addresses -> names).
MAX_KERNEL_SYMBOLS = 65536


class StackBuilder:
    """Turns a :class:`StackSampleEvent` into frames, leaf first."""

    def __init__(self, sampler, unwinder=None, namer=None) -> None:
        #: the ProfileSampler (kernel symbols, CPython process descriptions)
        self.sampler = sampler
        self.unwinder = unwinder if unwinder is not None else _native_unwinder()
        self.namer = namer if namer is not None else _code_namer()
        self._kernel_names: dict[int, Frame] = {}
        self._attached: set[int] = set()
        self.counters = {"stacks": 0, "native_incomplete": 0, "python_unnamed": 0}

    def frames(self, event: StackSampleEvent) -> tuple[Frame, ...]:
        self.counters["stacks"] += 1
        out = self._kernel_frames(event.kernel_addrs)
        python = self._python_groups(event)
        native = self._native_frames(event)
        placed = 0
        for frame in native:
            if frame.function == "_PyEval_EvalFrameDefault" and placed < len(python):
                out.extend(python[placed])
                placed += 1
            else:
                out.append(frame)
        for group in python[placed:]:  # the native part stopped before these evaluation calls
            out.extend(group)
        if event.flags & PF_PY_TRUNCATED:
            out.append(_PY_TRUNCATED)
        return tuple(out)

    # -- the three views --------------------------------------------------

    def _kernel_frames(self, addrs) -> list[Frame]:
        names = self._kernel_names
        out = []
        for addr in addrs:
            frame = names.get(addr)
            if frame is None:
                if len(names) >= MAX_KERNEL_SYMBOLS:
                    names.clear()
                frame = names[addr] = Frame(FRAME_KERNEL, self.sampler.kernel_symbol(addr), address=addr)
            out.append(frame)
        return out

    def _native_frames(self, event: StackSampleEvent) -> tuple[Frame, ...]:
        if self.unwinder is None or not event.stack:
            return (_NO_NATIVE,)
        stack = self.unwinder.unwind(event.pid, dwarf_registers(event.regs), event.stack_addr, event.stack)
        if not stack.complete:
            self.counters["native_incomplete"] += 1
        return stack.frames

    def _python_groups(self, event: StackSampleEvent) -> list[list[Frame]]:
        """The Python frames, leaf first, grouped by evaluation call."""
        if not event.py_frames or self.namer is None:
            return []
        proc = self.sampler.python_process(event.pid)
        if proc is None:
            return []
        from otelbpf.profiles.python.walk import frames_from_bpf

        if event.pid not in self._attached:
            self.namer.attach(proc)
            self._attached.add(event.pid)
        groups: list[list[Frame]] = [[]]
        for ref in frames_from_bpf(event.py_frames, proc.layout.bpf.owner_kind):
            frame = self.namer.name(event.pid, ref.code, ref.instr)
            if frame is None:
                self.counters["python_unnamed"] += 1
                frame = Frame(FRAME_MARKER, "[unknown python frame]")
            groups[-1].append(frame)
            if ref.ends_eval:
                groups.append([])
        if not groups[-1]:
            groups.pop()
        return groups

    def forget(self, pid: int) -> None:
        """The process exited: its unwinding state and code names go."""
        self._attached.discard(pid)
        if self.unwinder is not None:
            self.unwinder.forget(pid)
        if self.namer is not None:
            self.namer.forget(pid)


def _native_unwinder():
    try:
        from otelbpf.profiles.native.unwinder import NativeUnwinder

        return NativeUnwinder()
    except ImportError as exc:  # the C extension was not built
        log.warning("profiles: no native unwinder (%s): Python frames only; reinstall with libdw-dev", exc)
        return None


def _code_namer():
    from otelbpf.profiles.python.naming import CodeNamer

    return CodeNamer()
