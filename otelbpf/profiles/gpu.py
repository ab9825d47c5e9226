"""GPU profiles: the host side of the GPU by full call stack (docs/gpu.md "GPU profiles").

The GPU call probes (bpf/calls.c, sites flagged CALL_STACK by otelbpf/sources/gpu.py) take a
stack sample at the entry of each outermost allocation, pinning, copy, synchronisation and
NCCL collective (bpf/profile.c ``gpu_stack_sample``: kind PROFILE_GPU_CALL, stamped with the
call's entry time); the call itself arrives as usual, as a CallEvent at its return, and is
turned into a span by otelbpf/semantics/gpu_calls.py, which hands it here
(``GpuState.call_observer``) with the span's decoded attributes. :class:`GpuProfiles` joins
the two by (thread, entry time) and makes samples of:

* ``gpu_alloc``: every device allocation (cudaMalloc, cudaMallocAsync, cudaMallocManaged,
  cuMemAlloc*, cuMemCreate), one object and its bytes; failed ones too (an out-of-memory
  stack is worth seeing), marked with ``otelbpf.gpu.error_code``;
* ``gpu_inuse``: at each export, what is allocated and not freed, by the stack that allocated
  it: a table per process (address, or cuMemCreate handle -> size, stack, span), updated by
  the frees (cudaFree[Async], cuMemFree[Async]_v2 by address, cuMemRelease by handle),
  bounded (MAX_LIVE per process, the excess counted);
* ``gpu_pinned_alloc`` / ``gpu_pinned``: the same for pinned host memory (cudaHostAlloc,
  cudaMallocHost, cuMemHostAlloc, cudaHostRegister...; cudaFreeHost, cudaHostUnregister...);
* ``gpu_copy``: bytes per copy, with its direction (``otelbpf.gpu.memcpy.kind``) and, for
  host<->device, ``otelbpf.gpu.memcpy.pageable`` (the host pointer in no range seen pinned);
* ``gpu_wait``: ns inside stream/device/event/context synchronisations, synchronous copies
  (and asynchronous ones from pageable memory, synchronous in effect) and NCCL collectives,
  with ``otelbpf.gpu.wait.reason``;
* ``gpu_launch``: bpf/gpu.c samples 1 kernel launch in N per (thread, task), weighted N
  (PROFILE_GPU_LAUNCH; the weight travels in the header's total_len). These need no call:
  the table of kinds (otelbpf/profiles/kinds.py) sends them to the profiler's linked
  handler, as CPU samples, not here.

Call samples are linked to the span the call's span is a child of (the request span, or the
engine step of a thread serving none), read at export; launch samples like CPU samples
(``Profiler.serving``: the thread's request, else the engine step the thread is running). Allocation amounts are what the process asked CUDA for: with PyTorch's
caching allocator these are segments (the allocator's pool), not tensors; every alloc/inuse
sample says so (``otelbpf.gpu.memory.granularity``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from otelbpf import semconv as sc
from otelbpf.profiles.model import FRAME_MARKER, Frame, Sample
from otelbpf.profiles.records import StackSampleEvent
from otelbpf.profiles.types import GPU_ALLOC, GPU_COPY, GPU_INUSE, GPU_PINNED, GPU_PINNED_ALLOC, GPU_WAIT
from otelbpf.semantics.gpu_functions import CUDA_COPIES, NCCL_STACK_FUNCTIONS

log = logging.getLogger("otelbpf.profiles")

#: Live allocations (and pinned ranges) remembered per process; beyond, new ones are counted, not tracked.
MAX_LIVE = 65536
#: Stack samples and calls waiting for their other half, at most (the oldest go first).
MAX_PENDING = 16384
#: A call or sample unmatched for this long (event clock) is given up: the call is profiled with a
#: "[stack lost]" marker (its ring was full), the sample dropped (its call was not reported).
PENDING_NS = 2_000_000_000
#: Offset re-syncs between the two rings' decoders move stamps by far less than this.
JOIN_TOLERANCE_NS = 1_000_000

#: An unchanged in-use table is not snapshot again sooner than this (wall clock).
SNAPSHOT_REPEAT_NS = 1_000_000_000

GRANULARITY = "otelbpf.gpu.memory.granularity"
#: What one allocation object is: the CUDA call's block (with a caching allocator, a segment).
GRANULARITY_VALUE = "cuda_allocation"
FUNCTION = "otelbpf.gpu.function"
ERROR_CODE = "otelbpf.gpu.error_code"
MEMORY_KIND = "otelbpf.gpu.memory.kind"
WAIT_REASON = "otelbpf.gpu.wait.reason"

#: allocation function -> (size arg index, memory kind, key space: "ptr" by address, "vmm" by handle)
ALLOCS = {
    "cudaMalloc": (1, "device", "ptr"), "cuMemAlloc_v2": (1, "device", "ptr"),
    "cudaMallocAsync": (1, "stream_ordered", "ptr"), "cuMemAllocAsync": (1, "stream_ordered", "ptr"),
    "cudaMallocManaged": (1, "managed", "ptr"), "cuMemAllocManaged": (1, "managed", "ptr"),
    "cuMemCreate": (1, "vmm", "vmm"),
}  # fmt: skip
#: free function -> key space (the first argument is the address or handle)
FREES = {"cudaFree": "ptr", "cudaFreeAsync": "ptr", "cuMemFree_v2": "ptr", "cuMemFreeAsync": "ptr", "cuMemRelease": "vmm"}
#: pinning: function -> (address: "out0" or arg index, size arg index)
PINS = {"cudaHostAlloc": ("out0", 1), "cudaMallocHost": ("out0", 1), "cuMemHostAlloc": ("out0", 1),
        "cuMemAllocHost_v2": ("out0", 1), "cudaHostRegister": (0, 1), "cuMemHostRegister_v2": (0, 1)}
UNPINS = {"cudaFreeHost", "cuMemFreeHost", "cudaHostUnregister", "cuMemHostUnregister"}
SYNCS = {"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cuCtxSynchronize",
         "cuStreamSynchronize", "cuEventSynchronize"}  # fmt: skip
#: copies that return only when the bytes moved
BLOCKING_COPIES = {"cudaMemcpy", "cuMemcpy", "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2", "cuMemcpyDtoD_v2"}


class _ParentLink:
    """The span a GPU call's sample is linked to: its call span's parent (the request or the
    engine step), read when the interval is exported (a task call's parent is decided late)."""

    __slots__ = ("start",)

    def __init__(self, start) -> None:
        self.start = start

    @property
    def trace_id(self) -> bytes:
        return self.start.trace_id if self.start.parent_span_id else b""

    @property
    def span_id(self) -> bytes:
        return self.start.parent_span_id or b""


class _Live:
    """One allocation (or pinned range) not yet freed."""

    __slots__ = ("size", "frames", "link", "tid", "thread_name", "attributes")

    def __init__(self, size, frames, link, tid, thread_name, attributes) -> None:
        self.size = size
        self.frames = frames
        self.link = link
        self.tid = tid
        self.thread_name = thread_name
        self.attributes = attributes


_STACK_LOST = (Frame(FRAME_MARKER, "[stack lost]"),)


class GpuProfiles:
    """Joins GPU call stacks to their calls and keeps the in-use tables (one per Profiler)."""

    def __init__(self, profiler) -> None:
        self.profiler = profiler
        self.counters = profiler.counters
        #: (tid, entry ns) -> stack sample waiting for its call
        self._samples: OrderedDict[tuple[int, int], StackSampleEvent] = OrderedDict()
        #: (tid, entry ns) -> (start, call, attributes) waiting for its stack sample
        self._calls: OrderedDict[tuple[int, int], tuple] = OrderedDict()
        #: pid -> ("ptr" | "vmm", address or handle) -> _Live
        self.device: dict[int, dict[tuple[str, int], _Live]] = {}
        #: pid -> host address -> _Live
        self.pinned: dict[int, dict[int, _Live]] = {}
        #: the tables changed since the last snapshot, and when that was (wall clock)
        self._changed = False
        self._snapshot_ns = 0

    # -- the two halves ---------------------------------------------------

    def on_sample(self, event: StackSampleEvent) -> None:
        """A GPU call's stack (kind PROFILE_GPU_CALL), to be joined to its call."""
        key = (event.tid, event.ts_ns)
        call = self._calls.pop(key, None)
        if call is None:
            call = self._near(self._calls, event.tid, event.ts_ns)
        if call is not None:
            self._joined(event, *call)
            return
        self._samples[key] = event
        if len(self._samples) > MAX_PENDING:
            self._samples.popitem(last=False)
            self._count("otelbpf.profiles.gpu.unmatched_stacks")

    def on_call(self, start, call, attributes: dict) -> None:
        """GpuState.call_observer: every CUDA/NCCL call, once its span is built."""
        name = call.function
        ok = (call.ret & 0xFFFFFFFF) == 0
        if name in FREES:
            if ok:
                self._free(call.pid, FREES[name], call.args[0] if call.args else 0)
            return
        if name in UNPINS:
            if ok and call.args:
                table = self.pinned.get(call.pid)
                if table is not None and table.pop(call.args[0], None) is not None:
                    self._changed = True
            return
        if not _takes_stack(name):
            return
        key = (call.tid, call.ts_ns)
        event = self._samples.pop(key, None)
        if event is None:
            event = self._near(self._samples, call.tid, call.ts_ns)
        if event is not None:
            self._joined(event, start, call, attributes)
            return
        self._calls[key] = (start, call, attributes)
        if len(self._calls) > MAX_PENDING:
            _key, (old_start, old_call, old_attrs) = self._calls.popitem(last=False)
            self._profile(None, old_start, old_call, old_attrs)

    @staticmethod
    def _near(table: OrderedDict, tid: int, ts_ns: int):
        """The entry of ``tid`` within the join tolerance (a clock re-sync between the rings' reads)."""
        for key in table:
            if key[0] == tid and abs(key[1] - ts_ns) <= JOIN_TOLERANCE_NS:
                return table.pop(key)
        return None

    def _joined(self, event: StackSampleEvent, start, call, attributes) -> None:
        self._profile(event, start, call, attributes)

    # -- samples ----------------------------------------------------------

    def _profile(self, event: StackSampleEvent | None, start, call, attributes: dict) -> None:
        if event is not None:
            frames = self.profiler.builder.frames(event)
            thread_name = event.comm
        else:
            frames = _STACK_LOST
            thread_name = ""
            self._count("otelbpf.profiles.gpu.stacks_lost")
        link = _ParentLink(start)
        name = call.function
        args = tuple(call.args) + (0,) * (6 - len(call.args))
        code = call.ret & 0xFFFFFFFF
        code = code - (1 << 32) if code & 0x80000000 else code
        base = {FUNCTION: name}
        if code:
            base[ERROR_CODE] = code
        add = self.profiler.add_gpu_sample
        duration = max(call.end_ns - call.ts_ns, 0)
        if name in ALLOCS:
            size_i, kind, space = ALLOCS[name]
            size = args[size_i]
            attrs = dict(base, **{GRANULARITY: GRANULARITY_VALUE, MEMORY_KIND: kind})
            add(GPU_ALLOC, call, frames, (1, size), link, thread_name, attrs)
            if not code and call.out0:
                self._remember(self.device, call.pid, (space, call.out0), _Live(size, frames, link, call.tid, thread_name, attrs))
        elif name in PINS:
            where, size_i = PINS[name]
            address = call.out0 if where == "out0" else args[where]
            size = args[size_i]
            attrs = dict(base, **{MEMORY_KIND: "pinned_host"})
            add(GPU_PINNED_ALLOC, call, frames, (1, size), link, thread_name, attrs)
            if not code and address:
                self._remember(self.pinned, call.pid, address, _Live(size, frames, link, call.tid, thread_name, attrs))
        elif sc.OTELBPF_GPU_MEMCPY_KIND in attributes:
            attrs = dict(base, **{sc.OTELBPF_GPU_MEMCPY_KIND: attributes[sc.OTELBPF_GPU_MEMCPY_KIND]})
            pageable = attributes.get(sc.OTELBPF_GPU_MEMCPY_PAGEABLE)
            if pageable is not None:
                attrs[sc.OTELBPF_GPU_MEMCPY_PAGEABLE] = pageable
            add(GPU_COPY, call, frames, (int(attributes.get(sc.OTELBPF_GPU_MEMCPY_BYTES, 0)),), link, thread_name, attrs)
            if name in BLOCKING_COPIES:
                add(GPU_WAIT, call, frames, (duration,), link, thread_name, dict(attrs, **{WAIT_REASON: "blocking_copy"}))
            elif pageable:
                add(GPU_WAIT, call, frames, (duration,), link, thread_name, dict(attrs, **{WAIT_REASON: "pageable_copy"}))
        elif name in SYNCS:
            add(GPU_WAIT, call, frames, (duration,), link, thread_name, dict(base, **{WAIT_REASON: "synchronize"}))
        elif name.startswith("nccl"):
            attrs = dict(base, **{WAIT_REASON: "collective"})
            operation = attributes.get(sc.OTELBPF_NCCL_OPERATION)
            if operation:
                attrs[sc.OTELBPF_NCCL_OPERATION] = operation
            add(GPU_WAIT, call, frames, (duration,), link, thread_name, attrs)

    def _remember(self, tables: dict, pid: int, key, live: _Live) -> None:
        table = tables.get(pid)
        if table is None:
            table = tables[pid] = {}
        if key not in table and len(table) >= MAX_LIVE:
            self._count("otelbpf.profiles.gpu.live_untracked")
            return
        table[key] = live
        self._changed = True

    def _free(self, pid: int, space: str, address: int) -> None:
        table = self.device.get(pid)
        if table is not None and table.pop((space, address), None) is not None:
            self._changed = True

    # -- export -----------------------------------------------------------

    def snapshot(self, now_ns: int) -> None:
        """At each export: what is still allocated (and pinned), by allocating stack; and the
        halves given up on."""
        cutoff = self.profiler.last_clock_ns - PENDING_NS
        for key in [k for k, v in self._calls.items() if v[1].ts_ns < cutoff]:
            start, call, attrs = self._calls.pop(key)
            self._profile(None, start, call, attrs)
        for key in [k for k, v in self._samples.items() if v.ts_ns < cutoff]:
            del self._samples[key]
            self._count("otelbpf.profiles.gpu.unmatched_stacks")
        if not self._changed and now_ns - self._snapshot_ns < SNAPSHOT_REPEAT_NS:
            return  # e.g. the final flush right after the last interval's: the same snapshot twice
        self._changed = False
        self._snapshot_ns = now_ns
        for tables, profile in ((self.device, GPU_INUSE), (self.pinned, GPU_PINNED)):
            for pid, table in tables.items():
                for live in table.values():
                    self.profiler.add_snapshot(
                        Sample(profile, pid, live.tid, now_ns, live.frames, (1, live.size),
                               thread_name=live.thread_name, attributes=live.attributes), live.link,
                    )  # fmt: skip

    def forget(self, pid: int) -> None:
        self.device.pop(pid, None)
        self.pinned.pop(pid, None)

    def _count(self, name: str, value: int = 1) -> None:
        if self.counters is not None:
            self.counters.add(name, value)


def _takes_stack(name: str) -> bool:
    return name in ALLOCS or name in PINS or name in SYNCS or name in CUDA_COPIES or name in NCCL_STACK_FUNCTIONS
