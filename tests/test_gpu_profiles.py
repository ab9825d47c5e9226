"""GPU profiles without BPF (otelbpf/profiles/gpu.py): stack samples joined to their calls,
the in-use and pinned tables, copies, failures, bounds, and what samples are linked to.

The events are built here: StackSampleEvents with no stack bytes and no Python frames (a stub
builder names each stack by its ``stack_addr``), CallEvents as bpf/calls.c reports them. Calls go
through the CUDA span semantics (otelbpf/semantics/gpu_calls.py CudaCalls, which decides pageability
from the ranges it saw pinned) and reach the profiles by GpuState.call_observer, as in the agent.
"""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

from otelbpf import semconv as sc
from otelbpf.core.events import CallEvent
from otelbpf.core.identity import SpanStart, TraceGroup
from otelbpf.core.model import SpanKind
from otelbpf.core.selfmetrics import Counters
from otelbpf.profiles import gpu as gpu_profiles
from otelbpf.profiles.export import CPU_TIME
from otelbpf.profiles.model import FRAME_MARKER, FRAME_NATIVE, Frame
from otelbpf.profiles.profiler import Profiler
from otelbpf.profiles.records import (
    PROFILE_GPU_CALL,
    PROFILE_GPU_LAUNCH,
    PROFILE_OFF_CPU,
    PROFILE_ON_CPU,
    OffCpuEnd,
    StackSampleEvent,
)
from otelbpf.semantics.gpu_calls import CudaCalls
from otelbpf.semantics.gpu_state import GpuState
from otelbpf.semantics.gpu_steps import EngineSteps

PID, TID = 4242, 4243
T0 = time.time_ns()
MS = 1_000_000
H2D, D2H = 1, 2
OOM = 2  # cudaErrorMemoryAllocation


class StubBuilder:
    """Frames of a sample: one native frame named after its stack_addr."""

    def frames(self, event):
        return (Frame(FRAME_NATIVE, f"stack{event.stack_addr}"),)

    def forget(self, pid):
        pass


class Exported:
    def __init__(self):
        self.samples = []

    def export(self, samples, resources):
        self.samples.extend(samples)

    def shutdown(self):
        pass


class Resources:
    def attributes(self, pid):
        return {"process.pid": pid}


class Linker:
    """Linker.serving: (pid, tid) -> the request span open on the thread."""

    def __init__(self):
        self.windows = {}

    def serving(self, pid, tid, task_id=0):
        return self.windows.get((pid, tid))

    def serves_requests(self, pid):
        return any(key[0] == pid for key in self.windows)


class Rig:
    def __init__(self):
        self.counters = Counters()
        self.out = Exported()
        self.profiler = Profiler(None, [self.out], Resources(), self.counters, 49, interval_s=3600, builder=StubBuilder())
        self.profiler.linker = Linker()
        self.state = GpuState(self.counters)
        self.state.call_observer = self.profiler.gpu.on_call
        self.cuda = CudaCalls(self.state)
        #: the request span the calls are children of
        self.request = span(b"\x01" * 16, b"\x02" * 8)

    def stack(self, ts_ns, stack, tid=TID, kind=PROFILE_GPU_CALL, weight=0, task_id=0):
        self.profiler.on_sample(
            StackSampleEvent(ts_ns, PID, tid, task_id, kind, 0, "worker", -1, (0,) * 21, stack, b"", [], weight=weight)
        )

    def call(self, function, ts_ns, args=(), ret=0, out0=0, duration=MS, tid=TID):
        call = CallEvent(ts_ns, ts_ns + duration, PID, tid, "cuda", function, tuple(args), ret, out0=out0)
        start = SpanStart(self.request.group, b"\x03" * 8, self.request.span_id, SpanKind.INTERNAL, PID, tid, "thread")
        start.start_ns = ts_ns
        return self.cuda.span(start, call)

    def flush(self, at_ns):
        self.out.samples.clear()
        self.profiler.flush(at_ns)
        return self.out.samples

    def count(self, name):
        return self.counters.get(name)


def span(trace_id, span_id):
    start = SpanStart(TraceGroup(trace_id), span_id, b"", SpanKind.SERVER, PID, TID, "")
    start.start_ns = T0
    return start


def of(samples, profile_id):
    return [s for s in samples if s.profile.id == profile_id]


def by_stack(samples, profile_id, value=-1):
    """stack name -> summed value (the last of the profile's values unless told)."""
    totals = defaultdict(int)
    for s in of(samples, profile_id):
        totals[s.frames[0].function] += s.values[value]
    return dict(totals)


@pytest.fixture
def rig():
    return Rig()


# -- the join -------------------------------------------------------------------------------


def test_stack_and_call_join_on_thread_and_entry_time_in_either_order(rig):
    rig.stack(T0, 1)
    rig.call("cudaMalloc", T0, (0, 1000), out0=0xA000)  # sample first
    rig.call("cudaMalloc", T0 + 5 * MS, (0, 2000), out0=0xB000)  # call first ...
    rig.stack(T0 + 5 * MS, 2)  # ... its stack later
    # another thread's stack at the same instant is not this call's
    rig.stack(T0 + 10 * MS, 9, tid=TID + 1)
    rig.call("cudaMalloc", T0 + 10 * MS, (0, 3000), out0=0xC000)
    rig.stack(T0 + 10 * MS, 3)
    samples = rig.flush(T0 + 20 * MS)
    assert by_stack(samples, "gpu_alloc") == {"stack1": 1000, "stack2": 2000, "stack3": 3000}
    assert by_stack(samples, "gpu_alloc", value=0) == {"stack1": 1, "stack2": 1, "stack3": 1}
    for s in of(samples, "gpu_alloc"):
        assert s.attributes[gpu_profiles.FUNCTION] == "cudaMalloc"
        assert s.attributes[gpu_profiles.GRANULARITY] == "cuda_allocation"
        assert s.attributes[gpu_profiles.MEMORY_KIND] == "device"
        # linked to the span the call's span is a child of: the request
        assert (s.trace_id, s.span_id) == (rig.request.trace_id, rig.request.span_id)
        assert s.tid == TID and s.pid == PID and s.thread_name == "worker"
    assert rig.count("otelbpf.profiles.gpu.stacks_lost") == 0


def test_join_tolerates_a_clock_resync_within_the_tolerance_only(rig):
    tolerance = gpu_profiles.JOIN_TOLERANCE_NS
    rig.stack(T0 + tolerance, 1)  # 1 ms off: the same call
    rig.call("cudaMalloc", T0, (0, 100), out0=0xA000)
    rig.call("cudaMalloc", T0 + 50 * MS, (0, 200), out0=0xB000)
    rig.stack(T0 + 50 * MS - tolerance - 1, 2)  # just beyond: another call's
    assert by_stack(rig.flush(T0 + 60 * MS), "gpu_alloc") == {"stack1": 100}
    # the halves left wait, and are given up once the event clock is 2 s past them
    rig.profiler.tick(T0 + 50 * MS + gpu_profiles.PENDING_NS + 2 * MS, everything=False)
    samples = rig.flush(T0 + 3000 * MS)
    assert [(s.frames, s.values) for s in of(samples, "gpu_alloc")] == [((Frame(FRAME_MARKER, "[stack lost]"),), (1, 200))]
    assert rig.count("otelbpf.profiles.gpu.stacks_lost") == 1
    assert rig.count("otelbpf.profiles.gpu.unmatched_stacks") == 1


def test_unmatched_halves_wait_up_to_two_seconds_then_are_given_up(rig):
    rig.call("cudaDeviceSynchronize", T0, duration=7 * MS)  # its stack never comes (ring full)
    rig.stack(T0 + 5 * MS, 5)  # a stack whose call was never reported
    rig.profiler.tick(T0 + gpu_profiles.PENDING_NS - MS, everything=False)
    assert rig.flush(T0 + 100 * MS) == []  # not yet: both may still find their other half
    assert rig.count("otelbpf.profiles.gpu.stacks_lost") == rig.count("otelbpf.profiles.gpu.unmatched_stacks") == 0
    rig.profiler.tick(T0 + gpu_profiles.PENDING_NS + 10 * MS, everything=False)
    samples = rig.flush(T0 + 2500 * MS)
    waits = of(samples, "gpu_wait")
    assert len(waits) == 1 and waits[0].frames == (Frame(FRAME_MARKER, "[stack lost]"),)
    assert waits[0].values == (7 * MS,) and waits[0].attributes[gpu_profiles.WAIT_REASON] == "synchronize"
    assert (waits[0].trace_id, waits[0].span_id) == (rig.request.trace_id, rig.request.span_id)
    assert len(samples) == 1  # the stack alone made no sample
    assert rig.count("otelbpf.profiles.gpu.stacks_lost") == 1
    assert rig.count("otelbpf.profiles.gpu.unmatched_stacks") == 1
    # a call that finds its stack later is not there any more
    rig.stack(T0, 6)
    assert rig.flush(T0 + 2600 * MS) == []


# -- in use -----------------------------------------------------------------------------------


def test_in_use_per_allocating_stack_to_the_byte_and_frees_by_address(rig):
    allocations = [(1, 0xA000, 1000), (1, 0xA100, 24), (2, 0xB000, 65536), (2, 0xB100, 65536), (3, 0xC000, 7)]
    for i, (stack, address, size) in enumerate(allocations):
        rig.stack(T0 + i * MS, stack)
        rig.call("cudaMalloc", T0 + i * MS, (0, size), out0=address, duration=MS // 2)
    inuse = rig.flush(T0 + 10 * MS)
    assert by_stack(inuse, "gpu_inuse") == {"stack1": 1024, "stack2": 131072, "stack3": 7}
    assert by_stack(inuse, "gpu_inuse", value=0) == {"stack1": 2, "stack2": 2, "stack3": 1}
    assert all((s.trace_id, s.span_id) == (rig.request.trace_id, rig.request.span_id) for s in of(inuse, "gpu_inuse"))
    # frees take no stack: matched by address; an unknown address or a failed free changes nothing
    rig.call("cudaFree", T0 + 20 * MS, (0xA100,))
    rig.call("cudaFreeAsync", T0 + 21 * MS, (0xB000, 0))
    rig.call("cuMemFree_v2", T0 + 22 * MS, (0xC000,))
    rig.call("cudaFree", T0 + 23 * MS, (0xDEAD,))
    rig.call("cudaFree", T0 + 24 * MS, (0xA000,), ret=1)
    samples = rig.flush(T0 + 30 * MS)
    assert not of(samples, "gpu_alloc")  # the allocations were in the previous interval
    assert by_stack(samples, "gpu_inuse") == {"stack1": 1000, "stack2": 65536}
    assert by_stack(samples, "gpu_inuse", value=0) == {"stack1": 1, "stack2": 1}
    rig.call("cudaFree", T0 + 40 * MS, (0xA000,))
    rig.call("cudaFree", T0 + 41 * MS, (0xB100,))
    assert not of(rig.flush(T0 + 50 * MS), "gpu_inuse")


def test_vmm_handles_are_released_by_handle_not_by_address(rig):
    rig.stack(T0, 1)
    rig.call("cuMemCreate", T0, (0, 2 << 20), out0=0x77)  # out0: the handle
    rig.stack(T0 + MS, 2)
    rig.call("cuMemCreate", T0 + MS, (0, 4 << 20), out0=0x78)
    rig.stack(T0 + 2 * MS, 3)
    rig.call("cudaMalloc", T0 + 2 * MS, (0, 512), out0=0x78)  # an address equal to a handle's value
    samples = rig.flush(T0 + 10 * MS)
    assert {s.attributes[gpu_profiles.MEMORY_KIND] for s in of(samples, "gpu_alloc")} == {"vmm", "device"}
    assert by_stack(samples, "gpu_inuse") == {"stack1": 2 << 20, "stack2": 4 << 20, "stack3": 512}
    rig.call("cudaFree", T0 + 20 * MS, (0x77,))  # no such address: the handle stays
    rig.call("cuMemRelease", T0 + 21 * MS, (0x78,))  # the handle goes, the allocation at 0x78 stays
    assert by_stack(rig.flush(T0 + 30 * MS), "gpu_inuse") == {"stack1": 2 << 20, "stack3": 512}
    rig.call("cuMemRelease", T0 + 40 * MS, (0x77,))
    rig.call("cudaFree", T0 + 41 * MS, (0x78,))
    assert not of(rig.flush(T0 + 50 * MS), "gpu_inuse")


def test_failed_allocation_is_profiled_with_its_error_and_is_not_in_use(rig):
    rig.stack(T0, 1)
    rig.call("cudaMalloc", T0, (0, 1 << 40), ret=OOM, out0=0xA000)  # out0 left over: not an allocation
    rig.stack(T0 + MS, 2)
    rig.call("cudaHostAlloc", T0 + MS, (0, 4096, 0), ret=OOM, out0=0x10000)
    rig.stack(T0 + 2 * MS, 3)
    rig.call("cudaMalloc", T0 + 2 * MS, (0, 64), ret=(1 << 64) - 1, out0=0)  # a negative code, sign-extended
    samples = rig.flush(T0 + 10 * MS)
    alloc = of(samples, "gpu_alloc")
    assert [(s.frames[0].function, s.values, s.attributes[gpu_profiles.ERROR_CODE]) for s in alloc] == [
        ("stack1", (1, 1 << 40), OOM), ("stack3", (1, 64), -1),
    ]  # fmt: skip
    pinned = of(samples, "gpu_pinned_alloc")
    assert [(s.values, s.attributes[gpu_profiles.ERROR_CODE]) for s in pinned] == [((1, 4096), OOM)]
    assert not of(samples, "gpu_inuse") and not of(samples, "gpu_pinned")
    # a successful one has no error code
    rig.stack(T0 + 20 * MS, 4)
    rig.call("cudaMalloc", T0 + 20 * MS, (0, 10), out0=0xB000)
    ok = of(rig.flush(T0 + 30 * MS), "gpu_alloc")
    assert len(ok) == 1 and gpu_profiles.ERROR_CODE not in ok[0].attributes


# -- pinned memory and copies ---------------------------------------------------------------


def test_pinned_ranges_make_copies_pinned_or_pageable(rig):
    pinned, registered, pageable, device = 0x100000, 0x200000, 0x900000, 0xD000
    rig.stack(T0, 1)
    rig.call("cudaHostAlloc", T0, (0, 8192, 0), out0=pinned)
    rig.stack(T0 + MS, 2)
    rig.call("cudaHostRegister", T0 + MS, (registered, 4096, 0))
    copies = [  # (stack, function, args): inside a pinned range (not only at its start), outside, D2H
        (3, "cudaMemcpy", (device, pinned + 100, 300, H2D)),
        (4, "cudaMemcpy", (device, pageable, 500, H2D)),
        (5, "cudaMemcpyAsync", (device, registered + 4000, 70, H2D, 0)),
        (6, "cudaMemcpyAsync", (pageable, device, 900, D2H, 0)),
        (7, "cudaMemcpyAsync", (device, registered + 4096, 11, H2D, 0)),  # one past the registered range
    ]
    for i, (stack, function, args) in enumerate(copies):
        ts = T0 + (10 + i) * MS
        rig.stack(ts, stack)
        rig.call(function, ts, args, duration=3 * MS)
    samples = rig.flush(T0 + 50 * MS)
    attrs = {s.frames[0].function: (s.values, s.attributes) for s in of(samples, "gpu_copy")}
    pageable_of = {stack: a[sc.OTELBPF_GPU_MEMCPY_PAGEABLE] for stack, (_v, a) in attrs.items()}
    assert pageable_of == {"stack3": False, "stack4": True, "stack5": False, "stack6": True, "stack7": True}
    assert {stack: v for stack, (v, _a) in attrs.items()} == {
        "stack3": (300,), "stack4": (500,), "stack5": (70,), "stack6": (900,), "stack7": (11,),
    }  # fmt: skip
    assert attrs["stack6"][1][sc.OTELBPF_GPU_MEMCPY_KIND] == "device_to_host"
    assert attrs["stack3"][1][sc.OTELBPF_GPU_MEMCPY_KIND] == "host_to_device"
    # waits: the synchronous copies, and the asynchronous ones from pageable memory (synchronous in effect)
    waits = {s.frames[0].function: (s.values[0], s.attributes[gpu_profiles.WAIT_REASON]) for s in of(samples, "gpu_wait")}
    assert waits == {"stack3": (3 * MS, "blocking_copy"), "stack4": (3 * MS, "blocking_copy"),
                     "stack6": (3 * MS, "pageable_copy"), "stack7": (3 * MS, "pageable_copy")}  # fmt: skip
    # what is pinned, by the stack that pinned it
    assert by_stack(samples, "gpu_pinned_alloc") == {"stack1": 8192, "stack2": 4096}
    assert by_stack(samples, "gpu_pinned") == {"stack1": 8192, "stack2": 4096}
    assert {s.attributes[gpu_profiles.MEMORY_KIND] for s in of(samples, "gpu_pinned")} == {"pinned_host"}
    # unpinned: no longer in the table, and a copy from there is pageable again
    rig.call("cudaHostUnregister", T0 + 60 * MS, (registered,))
    rig.stack(T0 + 61 * MS, 8)
    rig.call("cudaMemcpyAsync", T0 + 61 * MS, (device, registered, 5, H2D, 0))
    samples = rig.flush(T0 + 70 * MS)
    assert by_stack(samples, "gpu_pinned") == {"stack1": 8192}
    assert [s.attributes[sc.OTELBPF_GPU_MEMCPY_PAGEABLE] for s in of(samples, "gpu_copy")] == [True]
    rig.call("cudaFreeHost", T0 + 80 * MS, (pinned,))
    assert not of(rig.flush(T0 + 90 * MS), "gpu_pinned")


# -- bounds -------------------------------------------------------------------------------------


def test_live_table_is_bounded_and_the_excess_counted(rig, monkeypatch):
    monkeypatch.setattr(gpu_profiles, "MAX_LIVE", 2)
    for i in range(4):
        rig.stack(T0 + i * MS, i)
        rig.call("cudaMalloc", T0 + i * MS, (0, 100 + i), out0=0xA000 + i)
    samples = rig.flush(T0 + 10 * MS)
    assert by_stack(samples, "gpu_alloc") == {"stack0": 100, "stack1": 101, "stack2": 102, "stack3": 103}
    assert by_stack(samples, "gpu_inuse") == {"stack0": 100, "stack1": 101}
    assert rig.count("otelbpf.profiles.gpu.live_untracked") == 2
    # room again once one is freed
    rig.call("cudaFree", T0 + 20 * MS, (0xA000,))
    rig.stack(T0 + 21 * MS, 9)
    rig.call("cudaMalloc", T0 + 21 * MS, (0, 9), out0=0xF000)
    assert by_stack(rig.flush(T0 + 30 * MS), "gpu_inuse") == {"stack1": 101, "stack9": 9}


def test_pending_halves_are_bounded_oldest_first(rig, monkeypatch):
    monkeypatch.setattr(gpu_profiles, "MAX_PENDING", 2)
    for i in range(4):  # stacks whose calls are not reported (yet)
        rig.stack(T0 + i * 10 * MS, i)
    assert rig.count("otelbpf.profiles.gpu.unmatched_stacks") == 2
    for i in range(4):  # the calls of the two kept find them; the two evicted ones' calls wait
        rig.call("cudaMalloc", T0 + i * 10 * MS, (0, 10 + i), out0=0xA000 + i)
    samples = rig.flush(T0 + 100 * MS)
    assert by_stack(samples, "gpu_alloc") == {"stack2": 12, "stack3": 13}
    for i in range(4, 7):  # calls whose stacks do not come: the oldest is profiled stackless
        rig.call("cudaMalloc", T0 + i * 10 * MS, (0, 10 + i), out0=0xA000 + i)
    assert rig.count("otelbpf.profiles.gpu.stacks_lost") == 3  # two pending calls of above + one of these
    lost = of(rig.flush(T0 + 200 * MS), "gpu_alloc")
    assert sorted(s.values[1] for s in lost) == [10, 11, 14]
    assert all(s.frames == (Frame(FRAME_MARKER, "[stack lost]"),) for s in lost)


# -- waits, launches and what they link to --------------------------------------------------------


def test_synchronisations_weigh_their_time(rig):
    rig.stack(T0, 1)
    rig.call("cudaStreamSynchronize", T0, (0,), duration=40 * MS)
    rig.stack(T0 + 50 * MS, 2)
    rig.call("cudaDeviceSynchronize", T0 + 50 * MS, duration=5 * MS)
    samples = rig.flush(T0 + 100 * MS)
    assert by_stack(samples, "gpu_wait") == {"stack1": 40 * MS, "stack2": 5 * MS}
    assert {s.attributes[gpu_profiles.WAIT_REASON] for s in of(samples, "gpu_wait")} == {"synchronize"}


def test_launch_samples_are_weighted_and_linked_like_cpu_samples(rig):
    rig.profiler.linker.windows[(PID, TID)] = rig.request
    rig.stack(T0, 1, kind=PROFILE_GPU_LAUNCH, weight=128)
    rig.stack(T0 + MS, 2, kind=PROFILE_GPU_LAUNCH, weight=0, tid=TID + 1)  # no weight: one launch; no request
    samples = rig.flush(T0 + 10 * MS)
    launches = {s.frames[0].function: s for s in of(samples, "gpu_launch")}
    assert launches["stack1"].values == (128,) and launches["stack2"].values == (1,)
    assert (launches["stack1"].trace_id, launches["stack1"].span_id) == (rig.request.trace_id, rig.request.span_id)
    assert launches["stack2"].span_id == b""


def test_samples_on_an_engine_thread_link_to_the_step_running_then(rig):
    """A thread serving no request: CPU and launch samples during an engine step are the step's,
    samples before it, after its synchronisation or on another thread are nobody's; a thread
    serving a request keeps its request."""
    emitted = []
    steps = EngineSteps(emitted.append)
    rig.profiler.steps = steps
    engine, other = TID + 10, TID + 11
    first = CallEvent(T0 + 10 * MS, T0 + 11 * MS, PID, engine, "cuda", "cudaMemcpy", (0, 0, 8, H2D))
    step = steps.place(first).parent_span_id
    rig.stack(T0 + 5 * MS, 1, tid=engine, kind=PROFILE_ON_CPU)  # before the step began
    rig.stack(T0 + 12 * MS, 2, tid=engine, kind=PROFILE_ON_CPU)
    rig.stack(T0 + 13 * MS, 3, tid=engine, kind=PROFILE_GPU_LAUNCH, weight=4)
    rig.stack(T0 + 13 * MS, 4, tid=other, kind=PROFILE_ON_CPU)
    rig.profiler.linker.windows[(PID, TID)] = rig.request
    rig.stack(T0 + 14 * MS, 5, tid=TID, kind=PROFILE_ON_CPU)  # serving a request: the request
    # blocked during the step (a lock, a queue): the step's off-CPU time
    rig.profiler.on_sample(StackSampleEvent(T0 + 15 * MS, PID, engine, 0, PROFILE_OFF_CPU, 0, "worker", -1, (0,) * 21,
                                            7, b"", [], switch_out_ns=77))  # fmt: skip
    rig.profiler.on_offcpu_end(OffCpuEnd(T0 + 18 * MS, PID, engine, 77, 3 * MS))
    steps.place(CallEvent(T0 + 20 * MS, T0 + 30 * MS, PID, engine, "cuda", "cudaStreamSynchronize", (0,)))
    rig.stack(T0 + 31 * MS, 6, tid=engine, kind=PROFILE_ON_CPU)  # the step ended at its synchronisation
    links = {s.frames[0].function: s.span_id for s in rig.flush(T0 + 100 * MS)}
    assert links == {"stack1": b"", "stack2": step, "stack3": step, "stack4": b"", "stack5": rig.request.span_id,
                     "stack6": b"", "stack7": step}  # fmt: skip


def test_the_profiler_counts_its_own_cpu_on_samples() -> None:
    """otelbpf.profiles.cpu_time{pipeline}: the pipeline thread's CPU on samples, in
    microseconds, reported once a millisecond has gathered and whatever is left at the end;
    never more than the thread really spent."""
    rig = Rig()
    spent_before = time.thread_time_ns()
    for i in range(2000):
        rig.stack(T0 + i * MS, i % 7, kind=PROFILE_ON_CPU)
        rig.profiler.tick(T0 + i * MS, False)
    rig.profiler.tick(T0 + 2000 * MS, True)
    spent_us = (time.thread_time_ns() - spent_before) / 1000
    counted = rig.counters.get(CPU_TIME, "pipeline")
    assert 0 < counted <= spent_us, (counted, spent_us)
    assert counted >= 2000 * 0.5  # two clock reads a sample at least (~0.4 us each here)
    assert rig.counters.get("otelbpf.profiles.samples", "cpu") == 2000


def test_stacks_are_built_in_batches_before_anything_reads_them() -> None:
    """A sample's stack is built with the next ones (BUILD_BATCH, or after BUILD_DELAY_NS on the
    event clock), and always before an export or the process's exit reads or forgets it."""
    from otelbpf.profiles.profiler import BUILD_BATCH, BUILD_DELAY_NS

    rig = Rig()
    built = []
    frames = rig.profiler.builder.frames
    rig.profiler.builder.frames = lambda event: built.append(event.stack_addr) or frames(event)
    for i in range(BUILD_BATCH - 1):
        rig.stack(T0 + i, i, kind=PROFILE_ON_CPU)
    assert built == []  # waiting for the batch
    rig.stack(T0 + BUILD_BATCH, BUILD_BATCH - 1, kind=PROFILE_ON_CPU)
    assert built == list(range(BUILD_BATCH))
    rig.stack(T0 + MS, 100, kind=PROFILE_ON_CPU)
    rig.profiler.tick(T0 + MS + BUILD_DELAY_NS - 1, False)
    assert len(built) == BUILD_BATCH
    rig.profiler.tick(T0 + MS + BUILD_DELAY_NS, False)  # the oldest waited long enough
    assert built[-1] == 100
    rig.stack(T0 + 2 * MS, 200, kind=PROFILE_ON_CPU)
    rig.profiler.forget(PID)  # the process exited: built while the builder still knows it
    assert built[-1] == 200
    rig.stack(T0 + 3 * MS, 300, kind=PROFILE_ON_CPU)
    exported = rig.flush(T0 + 4 * MS)
    assert sorted(s.frames[0].function for s in exported) == sorted(f"stack{n}" for n in [*range(BUILD_BATCH), 100, 200, 300])
