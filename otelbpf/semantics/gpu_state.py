"""What the GPU semantics of one pipeline remember between calls and spans.

Much of what a GPU call says is written elsewhere, later: the kernel launches
it carries go on its parent request span when that span leaves the pipeline;
a short call is folded into its parent; a pinning call decides whether later
copies are pageable; a communicator's set-up lets its collectives be matched
across ranks. :class:`GpuState` keeps all of that for one pipeline, shared by
the call spans (otelbpf/semantics/gpu_calls.py), the consumer that writes it
on the request spans (otelbpf/semantics/gpu_span_consumer.py), the engine
steps (otelbpf/semantics/gpu_steps.py) and the GPU profiles
(otelbpf/profiles/gpu.py); :func:`state_of` finds it from the pipeline.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from dataclasses import dataclass, field

from otelbpf import semconv as sc
from otelbpf.core.events import CallEvent
from otelbpf.core.identity import SpanStart
from otelbpf.core.model import SpanRecord, StatusCode
from otelbpf.semantics.nccl_collectives import CollectiveInstance, CollectiveTraces, RankIntervals
from otelbpf.semantics.nccl_lateness import CollectiveHold, Entry, StragglerDetector

#: Parent spans whose launches are remembered at once (the oldest is dropped beyond).
MAX_LEDGER = 65536
#: Task calls whose launches wait for their parent decision, at most (beyond: outside requests).
MAX_DEFERRED = 65536
#: Pinned ranges and live allocations remembered per process.
MAX_RANGES = 65536


@dataclass
class ProcessMemory:
    """What one process pinned and allocated, as the agent saw it."""

    #: sorted starts of pinned host ranges, and start -> end
    pinned_starts: list[int] = field(default_factory=list)
    pinned: dict[int, int] = field(default_factory=dict)
    #: device address (or cuMemCreate handle) -> bytes
    allocations: dict[int, int] = field(default_factory=dict)
    reserved: int = 0
    reserved_high: int = 0

    def pin(self, start: int, size: int) -> None:
        if not start or size <= 0 or len(self.pinned) >= MAX_RANGES:
            return
        if start not in self.pinned:
            bisect.insort(self.pinned_starts, start)
        self.pinned[start] = start + size

    def unpin(self, start: int) -> None:
        if self.pinned.pop(start, None) is not None:
            self.pinned_starts.remove(start)

    def is_pinned(self, address: int) -> bool:
        i = bisect.bisect_right(self.pinned_starts, address) - 1
        return i >= 0 and address < self.pinned[self.pinned_starts[i]]

    def allocate(self, address: int, size: int) -> None:
        if not address or size < 0 or len(self.allocations) >= MAX_RANGES:
            return
        self.reserved += size - self.allocations.get(address, 0)
        self.allocations[address] = size
        self.reserved_high = max(self.reserved_high, self.reserved)

    def release(self, address: int) -> int | None:
        """Bytes of the allocation at ``address`` (None: not seen allocated)."""
        size = self.allocations.pop(address, None)
        if size is not None:
            self.reserved -= size
        return size


class GpuState:
    """Shared by the CUDA and NCCL semantics and the launch-counting consumer of one pipeline."""

    def __init__(self, counters=None, min_call_ns: int = 0) -> None:
        self.counters = counters
        self.processes: dict[int, ProcessMemory] = {}
        #: parent span id -> [(first launch ns, launches, ns inside them)] booked by its children's calls
        self.launches: OrderedDict[bytes, list[tuple[int, int, int]]] = OrderedDict()
        #: launches per process (including those outside any request)
        self.launches_by_pid: dict[int, int] = {}
        #: (task call, first launch ns, launches, ns inside them) waiting for the call's parent decision
        self.deferred: list[tuple[SpanStart, int, int, int]] = []
        self.stragglers = StragglerDetector(counters)
        #: GPU engine steps (otelbpf/semantics/gpu_steps.py), set by attach(); None: no steps.
        self.steps = None
        #: CUDA calls shorter than this (ns) are folded into their parent (0: every call is a span)
        self.min_call_ns = min_call_ns
        #: parent span id -> function -> [calls folded, their ns]
        self.folds: OrderedDict[bytes, dict[str, list[int]]] = OrderedDict()
        #: span ids of folded calls on their way to the consumer (metrics only), as an ordered set
        self.folded: OrderedDict[bytes, None] = OrderedDict()
        #: span id -> its rank's entry, for collective spans on their way to the hold
        self.entries: OrderedDict[bytes, Entry] = OrderedDict()
        self.holds = CollectiveHold(counters)
        #: GPU profiles (otelbpf/profiles/gpu.py): called with (start, call, span attributes) for
        #: every CUDA/NCCL call once its span is built (None: no profiles)
        self.call_observer = None
        #: collective instances across ranks and nodes (otelbpf/semantics/nccl_collectives.py)
        self.collectives = CollectiveTraces(counters)
        #: span id -> its collective instance, for collective spans on their way to their instance's trace
        self.instances: OrderedDict[bytes, CollectiveInstance] = OrderedDict()
        #: each collective-issuing thread's time between its collectives
        self.intervals = RankIntervals()
        #: pid -> the version of the NCCL library it calls (None: not known); set by the assembly
        self.nccl_version = lambda pid: None

    def place_off_request(self, call: CallEvent) -> SpanStart | None:
        """A call on a thread that serves no request (not in an asyncio task): a child of its thread's engine step."""
        return self.steps.place(call) if self.steps is not None else None

    def memory(self, pid: int) -> ProcessMemory:
        memory = self.processes.get(pid)
        if memory is None:
            memory = self.processes[pid] = ProcessMemory()
        return memory

    def forget(self, pid: int) -> None:
        self.processes.pop(pid, None)
        self.launches_by_pid.pop(pid, None)
        self.stragglers.forget(pid)
        self.collectives.forget(pid)
        self.intervals.forget(pid)

    def memory_gauges(self) -> dict[int, list[tuple[str, str, str, int]]]:
        """pid -> its GPU memory gauges, for processes that allocated any (read by the metrics thread)."""
        out = {}
        for pid, memory in list(self.processes.items()):
            if memory.reserved_high:
                out[pid] = [
                    (sc.OTELBPF_GPU_MEMORY_RESERVED, "GPU memory reserved by the process's CUDA allocation calls"
                     " (allocated - freed, as seen since the agent started)", "By", memory.reserved),
                    (sc.OTELBPF_GPU_MEMORY_RESERVED_MAX, "High-water mark of otelbpf.gpu.memory.reserved", "By",
                     memory.reserved_high),
                ]
        return out

    def book_launches(self, start: SpanStart, call: CallEvent) -> None:
        if not call.launches:
            return
        self.launches_by_pid[call.pid] = self.launches_by_pid.get(call.pid, 0) + call.launches
        if not start.parent_span_id and start.task_id and not start.association and start.group.root().pending:
            self._defer(start, call)  # an asyncio task's call: its request is known when the task answers
            return
        self._book(start, call.first_launch_ns, call.launches, call.launch_ns)

    def _book(self, start: SpanStart, first_ns: int, launches: int, launch_ns: int) -> None:
        if not start.parent_span_id:
            self._count("otelbpf.gpu.launches.outside_requests", launches)
            return
        self.launches.setdefault(start.parent_span_id, []).append((first_ns, launches, launch_ns))
        if len(self.launches) > MAX_LEDGER:
            self.launches.popitem(last=False)
            self._count("otelbpf.gpu.launches.evicted")

    def _defer(self, start: SpanStart, call: CallEvent) -> None:
        """Hold the launches of a task call until the linker decides its parent
        (``Linker._decide``, before the request span it picks is built)."""
        if len(self.deferred) >= MAX_DEFERRED:
            self._count("otelbpf.gpu.launches.outside_requests", call.launches)
            return
        self.deferred.append((start, call.first_launch_ns, call.launches, call.launch_ns))

    def settle_deferred(self) -> None:
        """Book the held launches of task calls whose parent is now decided."""
        undecided = []
        for start, first_ns, launches, launch_ns in self.deferred:
            if start.association:  # decided: under its request (task) or a root (ambiguous)
                self._book(start, first_ns, launches, launch_ns)
            else:
                undecided.append((start, first_ns, launches, launch_ns))
        self.deferred = undecided

    def take_launches(self, span: SpanRecord) -> tuple[int, int] | None:
        """(launches, ns inside them) made while ``span`` was being served (None: none booked under it)."""
        booked = self.launches.pop(span.span_id, None)
        if booked is None:
            return None
        total = spent = 0
        for first_ns, count, launch_ns in booked:
            if first_ns >= span.start_ns:
                total += count
                spent += launch_ns
            else:
                self._count("otelbpf.gpu.launches.unattributed", count)
        return total, spent

    def fold(self, start: SpanStart, span: SpanRecord) -> bool:
        """Fold ``span`` (a successful CUDA call) when shorter than ``min_call_ns``: book it under
        its parent and mark it for the metrics only. True if folded."""
        duration = span.end_ns - span.start_ns
        if duration >= self.min_call_ns or span.status_code == StatusCode.ERROR:
            return False
        self._count("otelbpf.gpu.calls.folded")
        bounded_put(self.folded, span.span_id, None)
        if start.parent_span_id:
            functions = self.folds.get(start.parent_span_id)
            if functions is None:
                functions = {}
                bounded_put(self.folds, start.parent_span_id, functions)
            booked = functions.setdefault(span.name, [0, 0])
            booked[0] += 1
            booked[1] += duration
        return True

    def take_folds(self, span: SpanRecord) -> dict[str, list[int]] | None:
        """function -> [calls, ns] folded under ``span`` (None: none)."""
        return self.folds.pop(span.span_id, None)

    def _count(self, name: str, value: int = 1) -> None:
        if self.counters is not None:
            self.counters.add(name, value)


def bounded_put(table: OrderedDict, key, value) -> None:
    """``table[key] = value``, dropping the oldest entry past MAX_LEDGER (a span that never left)."""
    table[key] = value
    if len(table) > MAX_LEDGER:
        table.popitem(last=False)


def state_of(pipeline) -> GpuState | None:
    """The GPU state :func:`otelbpf.semantics.gpu.attach` gave ``pipeline`` (None: not attached)."""
    semantics = pipeline.registry.call_semantics(sc.OTELBPF_SCOPE_CUDA)
    return getattr(semantics, "state", None)
