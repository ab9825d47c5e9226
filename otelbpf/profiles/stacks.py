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

The per-sample path is kept short: the unwinder returns the same tuple for
the same native walk, the Python frames are named through the namer's
(code, instr) table, and a sample whose three views were all seen recently
gets the very tuple built then (:data:`MAX_MEMO` entries, each valid while
every Python frame in it is, see ``naming.REVERIFY_S``); a stack built anew is
interned by value. Identical stacks are then one object, which the encoders
count without hashing its frames again.
"""

from __future__ import annotations

import logging
import os
import time

from otelbpf.profiles.model import FRAME_KERNEL, FRAME_MARKER, Frame
from otelbpf.profiles.python import offsets as O
from otelbpf.profiles.python.naming import REVERIFY_S
from otelbpf.profiles.records import PF_PY_TRUNCATED, StackSampleEvent, dwarf_registers, py_frame_records

log = logging.getLogger("otelbpf.profiles")

#: The Python frames of a process whose interpreter the agent could not read.
_PY_TRUNCATED = Frame(FRAME_MARKER, "[python frames truncated]")
_NO_NATIVE = Frame(FRAME_MARKER, "[native frames unavailable]")
_UNKNOWN_PYTHON = Frame(FRAME_MARKER, "[unknown python frame]")
_NO_NATIVE_STACK = (_NO_NATIVE,)
_EVAL_FRAME = "_PyEval_EvalFrameDefault"
#: Bound on remembered kernel symbols (addresses -> names).
MAX_KERNEL_SYMBOLS = 65536
#: Bound on remembered whole stacks and Python parts (each memo starts over when full).
MAX_MEMO = 8192
_FOREVER = float("inf")
#: Set to 1, every sample is also unwound with libdw alone and differences counted
#: (``otelbpf.profiles.unwind.verify_mismatches``): a check, at twice the unwinding cost.
VERIFY_ENV = "OTELBPF_PROFILES_VERIFY_UNWIND"


class StackBuilder:
    """Turns a :class:`StackSampleEvent` into frames, leaf first."""

    def __init__(self, sampler, unwinder=None, namer=None) -> None:
        #: the ProfileSampler (kernel symbols, CPython process descriptions)
        self.sampler = sampler
        self.unwinder = unwinder if unwinder is not None else _native_unwinder()
        self.namer = namer if namer is not None else _code_namer()
        self._kernel_names: dict[int, Frame] = {}
        self._attached: set[int] = set()
        #: (pid, id(native tuple), Python records, kernel addresses, truncated) -> (native tuple, stack, valid until)
        self._stacks: dict[tuple, tuple] = {}
        #: (pid, Python records) -> (groups, valid until)
        self._pythons: dict[tuple, tuple] = {}
        #: stack -> the same stack, first built: equal stacks are one object
        self._interned: dict[tuple[Frame, ...], tuple[Frame, ...]] = {}
        self.counters = {"stacks": 0, "native_incomplete": 0, "python_unnamed": 0, "memo_hits": 0}

    def frames(self, event: StackSampleEvent) -> tuple[Frame, ...]:
        counters = self.counters
        counters["stacks"] += 1
        native = self._native_frames(event)
        records = event.py_frames
        if type(records) is not bytes:  # hashable, for the memo keys
            records = bytes(records) if isinstance(records, (bytearray, memoryview)) else tuple(map(tuple, records))
        pid = event.pid
        key = (pid, id(native), records, event.kernel_addrs, event.flags & PF_PY_TRUNCATED)
        now = time.monotonic()
        memo = self._stacks.get(key)
        if memo is not None and memo[0] is native and now < memo[2]:
            counters["memo_hits"] += 1
            return memo[1]
        python, valid_until = self._python_groups(pid, records, now)
        out = self._kernel_frames(event.kernel_addrs)
        placed = 0
        for frame in native:
            if placed < len(python) and frame.function == _EVAL_FRAME:
                out.extend(python[placed])
                placed += 1
            else:
                out.append(frame)
        for group in python[placed:]:  # the native part stopped before these evaluation calls
            out.extend(group)
        if event.flags & PF_PY_TRUNCATED:
            out.append(_PY_TRUNCATED)
        stack = tuple(out)
        interned = self._interned.get(stack)
        if interned is None:
            if len(self._interned) >= MAX_MEMO:
                self._interned.clear()
            interned = self._interned[stack] = stack
        stack = interned
        if len(self._stacks) >= MAX_MEMO:
            self._stacks.clear()
        self._stacks[key] = (native, stack, valid_until)  # holds native: its id stays its own
        return stack

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
            return _NO_NATIVE_STACK
        regs = event.regs
        if type(regs) is not bytes:  # the words of struct pt_regs, not its bytes
            regs = dwarf_registers(regs)
        stack = self.unwinder.unwind(event.pid, regs, event.stack_addr, event.stack)
        if not stack.complete:
            self.counters["native_incomplete"] += 1
        return stack.frames

    def _python_groups(self, pid: int, records, now: float) -> tuple[list[list[Frame]], float]:
        """The Python frames, leaf first, grouped by evaluation call, and until
        when they may be reused (a code object's name is re-checked after
        REVERIFY_S: its address may have been reused)."""
        if not records or self.namer is None:
            return [], _FOREVER
        key = (pid, records)
        memo = self._pythons.get(key)
        if memo is not None and now < memo[1]:
            return memo
        proc = self.sampler.python_process(pid)
        if proc is None:
            return [], _FOREVER
        namer = self.namer
        if pid not in self._attached:
            namer.attach(proc)
            self._attached.add(pid)
        table = namer.table(pid)
        every = proc.layout.bpf.owner_kind == O.OWNER_NONE
        records = py_frame_records(records)
        last = len(records) - 1
        groups: list[list[Frame]] = []
        group: list[Frame] = []
        oldest = _FOREVER
        for i, (code, instr, flags) in enumerate(records):
            if flags & O.FLAG_SHIM or not code:
                continue
            hit = table.get((code, instr))
            if hit is not None and now - hit[1].checked < REVERIFY_S:
                frame, entry = hit
            else:
                frame = namer.name(pid, code, instr)
                hit = table.get((code, instr))
                entry = hit[1] if hit is not None and hit[0] is frame else None
            if frame is None:
                self.counters["python_unnamed"] += 1
                frame = _UNKNOWN_PYTHON
                oldest = -_FOREVER  # not reused: the next sample tries again
            elif entry is None:
                oldest = -_FOREVER
            elif entry.checked < oldest:
                oldest = entry.checked
            group.append(frame)
            # the last frame (leaf to root) of an evaluation call: flagged so, before a shim, or always on 3.10
            if every or flags & O.FLAG_ENDS_EVAL or (i < last and records[i + 1][2] & O.FLAG_SHIM):
                groups.append(group)
                group = []
        if group:
            groups.append(group)
        result = (groups, oldest + REVERIFY_S)
        if len(self._pythons) >= MAX_MEMO:
            self._pythons.clear()
        self._pythons[(pid, key[1])] = result
        return result

    def forget(self, pid: int) -> None:
        """The process exited: its unwinding state and code names go."""
        self._attached.discard(pid)
        self._stacks = {k: v for k, v in self._stacks.items() if k[0] != pid}
        self._pythons = {k: v for k, v in self._pythons.items() if k[0] != pid}
        self._interned.clear()
        if self.unwinder is not None:
            self.unwinder.forget(pid)
        if self.namer is not None:
            self.namer.forget(pid)


def _native_unwinder():
    try:
        from otelbpf.profiles.native.unwinder import NativeUnwinder

        return NativeUnwinder(verify=os.environ.get(VERIFY_ENV) == "1")
    except ImportError as exc:  # the C extension was not built
        log.warning("profiles: no native unwinder (%s): Python frames only; reinstall with libdw-dev", exc)
        return None


def _code_namer():
    from otelbpf.profiles.python.naming import CodeNamer

    return CodeNamer()
