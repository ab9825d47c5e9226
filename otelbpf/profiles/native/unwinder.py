"""Unwinds and names native stacks copied by BPF, with libdw (``_dwunwind``).

A sample is a thread's user registers and a copy of its user stack from the
stack pointer up (at most 32 KiB). The compiled ``_dwunwind.Process`` keeps one
libdw session per process and walks the copy with DWARF CFI; this module keeps
those sessions in an LRU, decides when to re-read a process's mappings, builds
the :class:`Frame` and :class:`Mapping` objects on cache misses and counts.

Where unwinding cannot reach the thread's entry (no CFI, a PC in no module, a
truncated copy, the frame limit) the stack ends in one marker frame and is
incomplete: no caller is ever guessed.

The compiled walk runs on per-PC rule and symbol caches (``_dwunwind.c``);
``fast=False`` makes it use libdw alone, the reference. ``verify=True`` (the
agent: ``OTELBPF_PROFILES_VERIFY_UNWIND=1``) unwinds every sample both ways and
counts the samples whose frames or stop reason differ (``verify_mismatches``,
logged): a check on live samples, at about twice the unwinding cost.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter, OrderedDict
from typing import NamedTuple, Sequence

from otelbpf.profiles.model import FRAME_MARKER, FRAME_NATIVE, Frame, Mapping
from otelbpf.profiles.native import _dwunwind

log = logging.getLogger("otelbpf.profiles")

#: Registers a sample carries, in DWARF order (x86-64: rax, rdx, rcx, rbx,
#: rsi, rdi, rbp, rsp, r8..r15, rip).
NREGS: int = _dwunwind.NREGS
ARCH: str = _dwunwind.ARCH
#: CPython's evaluation loop: where Python frames are merged into native ones.
EVAL_FRAME = "_PyEval_EvalFrameDefault"
#: A process's mappings are re-read at most this often when a PC is in none.
REFRESH_INTERVAL_S = 1.0
#: Stop reason when the process is gone before its mappings could be read.
PROCESS_GONE = "process gone"

_REASONS: tuple[str, ...] = _dwunwind.REASONS
_NO_MODULE = _REASONS.index("pc not in a module")
_MARKERS = {r: Frame(FRAME_MARKER, f"[unwind stopped: {r}]") for r in (*_REASONS[1:], PROCESS_GONE)}
#: The marker each stop reason's walk ends in, indexed like _REASONS (the compiled walk appends it).
_MARKER_TUPLE = (None, *(_MARKERS[r] for r in _REASONS[1:]))


class UnwoundStack(NamedTuple):
    """A sample's native frames, leaf first; ``reason`` says why an incomplete
    stack stopped (its last frame is then the marker)."""

    frames: tuple[Frame, ...]
    complete: bool
    reason: str = ""


def is_eval_frame(frame: Frame) -> bool:
    """Whether a native frame is CPython's evaluation loop, where the thread's
    Python frames belong when the two stacks are merged."""
    return frame.kind == FRAME_NATIVE and frame.function == EVAL_FRAME


class _Namer:
    """Builds a frame on a cache miss (called by ``_dwunwind``): the symbol,
    else ``file+0xOFFSET`` in its module, else ``[unknown]``. It refers to
    neither the process nor the unwinder: the compiled Process holds it, and a
    cycle through that (untracked) object would never be collected."""

    __slots__ = ("mappings", "counts")

    def __init__(self, counts: Counter[str]) -> None:
        self.mappings: dict[tuple[str, int], Mapping] = {}
        self.counts = counts

    def __call__(
        self, pid: int, pc: int, symbol: str | None, module: str | None, low: int, high: int, build_id: str
    ) -> Frame:
        self.counts["frame_misses"] += 1
        if module is None:
            return Frame(FRAME_NATIVE, "[unknown]", address=pc)
        mapping = self.mappings.get((module, low))
        if mapping is None:
            # libdw's module spans the file from its first loadable segment, at offset 0
            mapping = Mapping(module, low, high, 0, build_id)
            self.mappings[(module, low)] = mapping
        name = symbol or f"{os.path.basename(module)}+{pc - low:#x}"
        return Frame(FRAME_NATIVE, name, address=pc, mapping=mapping)


#: Mismatches logged when verifying (the counter counts them all).
MAX_LOGGED_MISMATCHES = 5


class _Process:
    """One process: its libdw session, its frame namer, its last refresh; when
    verifying, a second session that walks with libdw alone."""

    __slots__ = ("native", "namer", "refreshed", "reference")

    def __init__(self, native: _dwunwind.Process, namer: _Namer, reference: _dwunwind.Process | None = None) -> None:
        self.native = native
        self.namer = namer
        self.refreshed = time.monotonic()
        self.reference = reference


class NativeUnwinder:
    """Unwinds samples of many processes; bounded in processes and cached frames.

    Not thread-safe: one reader thread owns it (libdw sessions are not shared).
    """

    def __init__(self, max_processes: int = 64, max_symbols: int = 65536, *, fast: bool = True, verify: bool = False) -> None:
        self.max_processes = max(1, max_processes)
        self.max_symbols = max(1, max_symbols)
        #: walk and name through the per-PC caches (False: libdw alone)
        self.fast = fast
        #: also walk every sample with libdw alone and count the differences
        self.verify = verify
        self._procs: OrderedDict[int, _Process] = OrderedDict()
        self._counts: Counter[str] = Counter()

    def unwind(
        self, pid: int, regs: Sequence[int], stack_addr: int, stack: bytes, max_frames: int = 127
    ) -> UnwoundStack:
        """Walks one sample of ``pid``: ``regs`` in DWARF order (:data:`NREGS`),
        ``stack`` the bytes copied from ``stack_addr``."""
        self._counts["samples"] += 1
        proc = self._process(pid)
        if proc is None:
            return self._stopped((), PROCESS_GONE)
        frames, stop = proc.native.unwind(regs, stack_addr, stack, max_frames)
        if stop == _NO_MODULE and self._auto_refresh(pid, proc):
            frames, stop = proc.native.unwind(regs, stack_addr, stack, max_frames)
        if proc.reference is not None:
            self._verify(pid, proc.reference, frames, stop, regs, stack_addr, stack, max_frames)
        if stop:  # the frames end in the stop reason's marker
            reason = _REASONS[stop]
            self._counts["frames"] += len(frames) - 1
            self._counts[f"incomplete:{reason}"] += 1
            return UnwoundStack(frames, False, reason)
        self._counts["frames"] += len(frames)
        self._counts["complete"] += 1
        return UnwoundStack(frames, True)

    def _verify(self, pid: int, reference, frames, stop: int, regs, stack_addr: int, stack, max_frames: int) -> None:
        expected, expected_stop = reference.unwind(regs, stack_addr, stack, max_frames)
        self._counts["verified"] += 1
        if expected == frames and expected_stop == stop:
            return
        self._counts["verify_mismatches"] += 1
        if self._counts["verify_mismatches"] <= MAX_LOGGED_MISMATCHES:
            log.warning(
                "profiles: pid %d: the cached unwinder gave %s (%s), libdw alone %s (%s)", pid,
                [f.function for f in frames], _REASONS[stop] or "complete",
                [f.function for f in expected], _REASONS[expected_stop] or "complete",
            )  # fmt: skip

    def symbol_at(self, pid: int, address: int) -> str | None:
        """The symbol at ``address`` in ``pid`` (demangled, as frames are named), or None where no
        module or symbol covers it: a GPU kernel's host function, named by its own symbol."""
        proc = self._process(pid)
        if proc is None:
            return None
        frame = proc.native.frame_at(address)
        if frame.mapping is None and self._auto_refresh(pid, proc):
            frame = proc.native.frame_at(address)
        if frame.mapping is None or frame.function.startswith((f"{os.path.basename(frame.mapping.path)}+", "[")):
            return None
        return frame.function

    def refresh(self, pid: int) -> None:
        """Re-reads ``pid``'s mappings now (a library was loaded or unloaded)."""
        proc = self._procs.get(pid)
        if proc is not None:
            self._refresh(pid, proc)

    def forget(self, pid: int) -> None:
        """Drops what is kept for ``pid`` (the process exited)."""
        proc = self._procs.pop(pid, None)
        if proc is not None:
            self._retire(proc)

    @property
    def stats(self) -> dict[str, int]:
        """Counters: samples, frames, complete, ``incomplete:<reason>``,
        processes, evictions, refreshes, frame_misses, frame_cache_resets; the
        compiled walks' (``walks:fast``, ``walks:libdw``, ``walks:rule_misses``,
        ``walks:symbol_lookups``, ...) of the live processes; verified and
        verify_mismatches when verifying."""
        live_resets = sum(p.native.cache_resets for p in self._procs.values())
        counts = dict(self._counts)
        counts["frame_cache_resets"] = counts.get("frame_cache_resets", 0) + live_resets
        counts["processes"] = len(self._procs)
        for proc in self._procs.values():
            for key, value in proc.native.walks.items():
                counts[f"walks:{key}"] = counts.get(f"walks:{key}", 0) + value
        return counts

    def _stopped(self, frames: tuple[Frame, ...], reason: str) -> UnwoundStack:
        self._counts[f"incomplete:{reason}"] += 1
        return UnwoundStack((*frames, _MARKERS[reason]), False, reason)

    def _process(self, pid: int) -> _Process | None:
        """The session for ``pid``, most recently used; opens one (evicting the
        least recently used beyond ``max_processes``), None when it is gone."""
        proc = self._procs.get(pid)
        if proc is not None:
            self._procs.move_to_end(pid)
            return proc
        namer = _Namer(self._counts)
        try:
            native = _dwunwind.Process(pid, namer, self.max_symbols, _MARKER_TUPLE)
            native.fast = self.fast
            reference = None
            if self.verify:
                reference = _dwunwind.Process(pid, _Namer(Counter()), self.max_symbols, _MARKER_TUPLE)
                reference.fast = False
        except OSError:
            self._counts["open_failures"] += 1
            return None
        proc = _Process(native, namer, reference)
        self._procs[pid] = proc
        while len(self._procs) > self.max_processes:
            self._retire(self._procs.popitem(last=False)[1])
            self._counts["evictions"] += 1
        return proc

    def _retire(self, proc: _Process) -> None:
        self._counts["frame_cache_resets"] += proc.native.cache_resets

    def _auto_refresh(self, pid: int, proc: _Process) -> bool:
        """Re-reads the mappings when a PC was in none, at most once per
        :data:`REFRESH_INTERVAL_S` per process (JIT code would otherwise re-read
        them on every sample)."""
        if time.monotonic() - proc.refreshed < REFRESH_INTERVAL_S:
            return False
        return self._refresh(pid, proc)

    def _refresh(self, pid: int, proc: _Process) -> bool:
        proc.refreshed = time.monotonic()
        proc.namer.mappings.clear()
        self._counts["refreshes"] += 1
        try:
            proc.native.refresh()
            if proc.reference is not None:
                proc.reference.refresh()
        except OSError:
            self.forget(pid)
            return False
        return True
