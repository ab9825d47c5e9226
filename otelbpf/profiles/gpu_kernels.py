"""GPU kernels named on the stack that launched them: the ``GPU: <kernel>`` leaf of a launch sample.

A ``gpu_launch`` sample (1 kernel launch in N, bpf/gpu.c) carries what was launched: the handle
the driver's launch call was given (``cuLaunchKernel(f, ...)``: a ``CUfunction``, or a ``CUkernel``
from a CUDA library; a ``CUgraphExec`` for ``cuGraphLaunch``) and, when the launch came through the
runtime, the function ``cudaLaunchKernel`` was given (the kernel's host function, or CUDA 13's
``cudaKernel_t``). Its stack gets one more frame on top, the kernel, named from the first of:

1. the handle's name, as CUDA learned it and the probes saw it (bpf/gpu_names.c:
   ``cuModuleGetFunction``, ``cuLibraryGetKernel``; ``cuKernelGetFunction`` makes a function an
   alias of its kernel), for modules and libraries loaded while the agent runs (the runtime loads
   a library's kernels on their first launch);
2. the runtime function's name: registered by nvcc's constructor (``__cudaRegisterFunction``,
   seen for libraries loaded while libcudart is probed), else an alias (``__cudaGetKernel``) of
   one, else the symbol at its address when that is code: nvcc names a kernel's host function
   after the kernel;
3. the host stub on the launch stack: nvcc's ``__device_stub__<mangled kernel>`` calls
   ``cudaLaunchKernel``, so the stub's frame names the kernel even where nothing else was seen;
4. else the handle, ``GPU: [kernel 0x...]``, counted (``otelbpf.profiles.gpu.kernel_frames``
   with ``named_by="none"``): a kernel loaded before the agent started, launched from a stripped
   library through the driver.

Names are demangled (``_Z10vector_addPKfS0_Pfi`` -> ``vector_add(float const*, float const*,
float*, int)``); a graph launch is ``GPU: [CUDA graph 0x...]`` (a replay of many kernels the host
never sees one by one). The frame's kind is ``cuda`` (``profile.frame.type``), so every output
(OTLP, pprof, the page) shows it as GPU code. The width under it is launches, sampled 1 in N and
weighted N, not GPU time (docs/gpu.md, "Kernel time: what the widths mean").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections import Counter

from otelbpf.host.procfs import executable_mappings
from otelbpf.profiles.model import FRAME_CUDA, Frame
from otelbpf.profiles.records import (
    GPU_NAME_KERNEL_FUNCTION,
    GPU_NAME_REGISTERED,
    GPU_NAME_RUNTIME_KERNEL,
    PF_GPU_GRAPH,
    GpuKernelName,
    StackSampleEvent,
)

log = logging.getLogger("otelbpf.profiles")

#: The label of a kernel frame: what the AI flame graphs of inference platforms show.
PREFIX = "GPU: "
#: nvcc's host stubs: ``__device_stub__`` + the kernel's mangled name without its leading ``_``.
STUB_PREFIX = "__device_stub__"
#: Names (and aliases) remembered per process; beyond, the table starts over (counted).
MAX_NAMES = 65536
#: Aliases followed at most (a function of a kernel of ...): a loop in bad data must end.
MAX_HOPS = 4
#: Longest name read from the process when the kernel's copy was cut (bpf: GPU_NAME_BYTES - 1).
MAX_NAME_BYTES = 4096
#: Kernel stacks remembered (stack tuple, kernel frame) -> the stack with the kernel on top.
MAX_STACKS = 8192
#: The counter of kernel frames by what named them (``named_by``): handle, runtime function,
#: registered, symbol, stub, graph, none.
KERNEL_FRAMES = "otelbpf.profiles.gpu.kernel_frames"


class KernelFrames:
    """Per process, what each kernel handle is called; the kernel frame of each launch sample.

    ``symbol_at(pid, address)`` names an address from the process's symbols (the native
    unwinder's, None where it has none); ``counters`` (the agent's) counts the frames by what
    named them."""

    def __init__(self, symbol_at=None, counters=None) -> None:
        self.symbol_at = symbol_at
        self.counters = counters
        #: pid -> handle -> mangled name; pid -> handle -> the handle it stands for
        self._names: dict[int, dict[int, str]] = {}
        self._aliases: dict[int, dict[int, int]] = {}
        #: pid -> host functions registered with the runtime (so such a handle reads "registered")
        self._registered: dict[int, set[int]] = {}
        #: pid -> address -> the code symbol there (None: none, or not code)
        self._symbols: dict[int, dict[int, str | None]] = {}
        #: label -> its frame (one object per kernel: the encoders count frames by identity)
        self._frames: dict[str, Frame] = {}
        #: (id(stack), id(kernel frame)) -> (stack, frame, stack with the frame on top)
        self._stacks: dict[tuple[int, int], tuple] = {}
        self.counts: Counter[str] = Counter()

    # -- what CUDA says ----------------------------------------------------------------------

    def on_name(self, event: GpuKernelName) -> None:
        """A handle's name (or the handle it stands for) in process ``event.pid``."""
        if event.alias:
            table = self._aliases.setdefault(event.pid, {})
            if len(table) >= MAX_NAMES:
                table.clear()
                self.counts["tables_full"] += 1
            table[event.handle] = event.alias
            return
        name = event.name
        if (event.truncated or not name) and event.name_addr:
            # cut at GPU_NAME_BYTES, or not read at all: the kernel cannot fault a page in, and a
            # library's constructor registers names from read-only data no one touched yet
            name = _read_whole_name(event.pid, event.name_addr) or name
        if not name:
            return
        table = self._names.setdefault(event.pid, {})
        if len(table) >= MAX_NAMES:
            table.clear()
            self.counts["tables_full"] += 1
        table[event.handle] = name
        if event.source == GPU_NAME_REGISTERED:
            self._registered.setdefault(event.pid, set()).add(event.handle)

    def name_of(self, pid: int, handle: int) -> str | None:
        """The name CUDA gave ``handle`` (through its aliases), or None."""
        names = self._names.get(pid)
        aliases = self._aliases.get(pid)
        for _ in range(MAX_HOPS):
            if not handle:
                return None
            name = names.get(handle) if names else None
            if name is not None:
                return name
            handle = aliases.get(handle, 0) if aliases else 0
        return None

    def _resolved(self, pid: int, handle: int) -> int:
        """The handle ``handle`` stands for at the end of its aliases."""
        aliases = self._aliases.get(pid) or {}
        for _ in range(MAX_HOPS):
            if handle not in aliases:
                break
            handle = aliases[handle]
        return handle

    def forget(self, pid: int) -> None:
        """The process exited: its handles mean nothing any more."""
        self._names.pop(pid, None)
        self._aliases.pop(pid, None)
        self._registered.pop(pid, None)
        self._symbols.pop(pid, None)

    # -- the kernel frame --------------------------------------------------------------------

    def leaf(self, event: StackSampleEvent, frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
        """``frames`` (the launch's stack, leaf first) with the kernel it launched on top; the same
        stack object for the same stack and kernel, as the stack builder interns them. A sample
        that says nothing of what it launched (no handle: the probe was not given one) keeps its
        stack as it is."""
        if not event.gpu_kernel and not event.gpu_host_function:
            return frames
        kernel = self.frame(event, frames)
        key = (id(frames), id(kernel))
        known = self._stacks.get(key)
        if known is not None and known[0] is frames and known[1] is kernel:
            return known[2]
        stack = (kernel, *frames)
        if len(self._stacks) >= MAX_STACKS:
            self._stacks.clear()
        self._stacks[key] = (frames, kernel, stack)  # holds both: their ids stay theirs
        return stack

    def frame(self, event: StackSampleEvent, frames: tuple[Frame, ...] = ()) -> Frame:
        """The kernel frame of a launch sample (see the module's docstring for the order)."""
        handle, host = event.gpu_kernel, event.gpu_host_function
        if event.flags & PF_GPU_GRAPH:
            return self._frame(f"[CUDA graph {handle:#x}]", "graph", handle)
        name = self.name_of(event.pid, handle)
        if name is not None:
            return self._frame(demangle(name), "handle")
        if host:
            name = self.name_of(event.pid, host)
            if name is not None:
                registered = self._resolved(event.pid, host) in self._registered.get(event.pid, ())
                return self._frame(demangle(name), "registered" if registered else "runtime_function")
            symbol = self._code_symbol(event.pid, self._resolved(event.pid, host))
            if symbol and not symbol.startswith(STUB_PREFIX):
                return self._frame(demangle(symbol), "symbol")
        stub = kernel_of_stub(frames)
        if stub is not None:
            return self._frame(stub, "stub")
        return self._frame(f"[kernel {handle:#x}]", "none", handle)

    def _code_symbol(self, pid: int, address: int) -> str | None:
        """The symbol at ``address`` when it is code (a host function): a runtime handle (CUDA
        13's cudaKernel_t) points into the runtime's data, where a symbol would name something
        else. Remembered per process and address."""
        known = self._symbols.setdefault(pid, {})
        if address in known:
            return known[address]
        symbol = None
        if self.symbol_at is not None and any(m.start <= address < m.end for m in executable_mappings(pid)):
            symbol = self.symbol_at(pid, address)
        if len(known) >= MAX_NAMES:
            known.clear()
        known[address] = symbol
        return symbol

    def _frame(self, name: str, named_by: str, address: int = 0) -> Frame:
        self.counts[named_by] += 1
        if self.counters is not None:
            self.counters.add(KERNEL_FRAMES, label=named_by)
        label = PREFIX + name
        frame = self._frames.get(label)
        if frame is None:
            if len(self._frames) >= MAX_NAMES:
                self._frames.clear()
            frame = self._frames[label] = Frame(FRAME_CUDA, label, address=address)
        return frame


def kernel_of_stub(frames: tuple[Frame, ...]) -> str | None:
    """The kernel an nvcc host stub on the stack launches: the nearest frame to the leaf named
    ``__device_stub__<kernel's mangled name without its "_">`` (demangled: ``(args)`` follow)."""
    for frame in frames:
        function = frame.function
        if function.startswith(STUB_PREFIX):
            mangled = function[len(STUB_PREFIX) :].split("(", 1)[0]
            if mangled.startswith("Z"):
                return demangle("_" + mangled)
            return mangled or None
    return None


def _read_whole_name(pid: int, address: int) -> str | None:
    """A kernel name longer than the kernel copied, read whole from the process (it lives in the
    library's read-only data, or the caller's string)."""
    from otelbpf.profiles.python.interpreter import ProcMem

    mem = ProcMem(pid)
    try:
        data = b""
        while len(data) < MAX_NAME_BYTES:
            chunk = mem.read(address + len(data), 256)
            if chunk is None:
                break
            end = chunk.find(b"\0")
            if end >= 0:
                return (data + chunk[:end]).decode("utf-8", "replace")
            data += chunk
        return None
    finally:
        mem.close()


# -- C++ names ---------------------------------------------------------------------------------

_demangled: dict[str, str] = {}
_cxa_demangle = None
_free = None


def demangle(name: str) -> str:
    """A C++ (Itanium ABI) mangled name demangled; anything else (a Triton kernel's plain name,
    an already demangled symbol) as it is. libstdc++'s own demangler, cached."""
    if not name.startswith("_Z"):
        return name
    known = _demangled.get(name)
    if known is not None:
        return known
    global _cxa_demangle, _free
    if _cxa_demangle is None:
        try:
            library = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
            _cxa_demangle = library.__cxa_demangle
            _cxa_demangle.restype = ctypes.c_void_p
            _cxa_demangle.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
            _free = ctypes.CDLL(None).free
            _free.argtypes = [ctypes.c_void_p]
        except (OSError, AttributeError) as exc:
            log.info("profiles: no C++ demangler (%s): GPU kernel names stay mangled", exc)
            _cxa_demangle = False
    out = name
    if _cxa_demangle:
        status = ctypes.c_int(0)
        pointer = _cxa_demangle(name.encode("utf-8", "replace"), None, None, ctypes.byref(status))
        if pointer:
            if status.value == 0:
                out = ctypes.string_at(pointer).decode("utf-8", "replace")
            _free(pointer)
    if len(_demangled) >= MAX_NAMES:
        _demangled.clear()
    _demangled[name] = out
    return out
