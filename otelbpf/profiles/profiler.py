"""Stack samples in the pipeline: linked to the span they served, built into
stacks, handed to the exporters once per interval.

The sampler's events travel with the socket events through the reorder
window, so the pipeline handles a sample after every event that came before
it: the linker's request windows are then what they were at the sample's
instant, and the sample is linked by the rules the spans use
(:meth:`otelbpf.core.association.Linker.serving`):

- the one request window open on the sample's thread: its SERVER span;
- a sample taken in an asyncio task step: the request that task answers.
  That is known only when the response is written (the task that reads a
  request is often not the one that answers it), so such samples wait for
  the answer (:meth:`Profiler.answered`), bounded in number and time, and
  go unlinked if none comes;
- a CPU, off-CPU or launch sample on a thread serving no request (a batching
  engine's thread, outside an asyncio task): the engine step the thread is
  running then (``EngineSteps.serving``, otelbpf/semantics/gpu_steps.py), as
  its GPU calls are that step's children (an off-CPU sample: when it blocked);
- otherwise, no link: an unlinked sample is better than a wrong one.

Links are read when the interval is exported, so a trace that merged into
another meanwhile (a late client) is named by its final trace id.

Off-CPU samples are taken when a thread blocks; the time it stayed blocked
arrives with the :class:`~otelbpf.profiles.records.OffCpuEnd` of the same
switch. Blocks shorter than the minimum never get one: the newest sample per
thread is kept, and replaced by the thread's next block.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from time import thread_time_ns

from otelbpf.profiles.export import CPU_TIME
from otelbpf.profiles.gpu import GpuProfiles
from otelbpf.profiles.gpu_kernels import KernelFrames
from otelbpf.profiles.model import Sample
from otelbpf.profiles.kinds import PROFILE_KINDS
from otelbpf.profiles.records import OffCpuEnd, StackSampleEvent
from otelbpf.profiles.stacks import StackBuilder
from otelbpf.profiles.types import OFF_CPU, cpu_type
from otelbpf.semantics.gpu_state import state_of

log = logging.getLogger("otelbpf.profiles")

#: Samples of asyncio tasks waiting to learn which request their task answers.
MAX_TASK_SAMPLES = 4096
#: ... and for how long (event clock) before they go unlinked.
TASK_SAMPLE_WAIT_NS = 30_000_000_000
#: Off-CPU samples waiting for their thread to run again (one per thread).
MAX_BLOCKED_THREADS = 4096
#: Samples held for one export interval; beyond, they are counted and dropped.
MAX_INTERVAL_SAMPLES = 200_000
#: A sample's stack is built with the next ones, when this many wait or the oldest has waited
#: BUILD_DELAY_NS (event clock), and before anything reads them (export, a process's exit).
#: On a server with traffic a sample comes alone between requests, and built at once it met
#: every cache cold: 111 -> 68-93 us a sample at 19 Hz, 72 -> 60 at 99 Hz (the agent's own count,
#: bench/README.md, "Profiles"). Each waiting sample holds its stack copy (up to 32 KiB).
BUILD_BATCH = 32
BUILD_DELAY_NS = 250_000_000
#: The pipeline thread's CPU on samples (otelbpf.profiles.cpu_time{pipeline}) is
#: added to the counters once this much has gathered (or at exit).
CPU_REPORT_NS = 1_000_000


class Profiler:
    """Links, builds and exports the samples of one sampler. Each sample goes to its kind's
    handler (otelbpf/profiles/kinds.py: ``kinds``, the table, says which)."""

    def __init__(self, sampler, exporters, resources, counters, hz: int, interval_s: float = 10.0, builder=None,
                 kinds=PROFILE_KINDS) -> None:  # fmt: skip
        self.sampler = sampler
        self.exporters = list(exporters)
        self.resources = resources
        self.counters = counters
        self.interval_ns = int(interval_s * 1e9)
        self.cpu = cpu_type(hz)
        self.builder = builder if builder is not None else StackBuilder(sampler)
        self.linker = None
        #: the GPU state's engine steps (otelbpf/semantics/gpu_steps.py), set at attach; None: no GPU probes
        self.steps = None
        #: (sample, SpanStart or None), in arrival order, for the current interval
        self._interval: list[tuple[Sample, object]] = []
        #: (pid, task id) -> [(sample, ts_ns)] awaiting the request their task answers
        self._by_task: OrderedDict[tuple[int, int], list[Sample]] = OrderedDict()
        self._task_samples = 0
        #: tid -> (off-CPU sample event, SpanStart or None) awaiting its OffCpuEnd
        self._blocked: OrderedDict[int, tuple[StackSampleEvent, object]] = OrderedDict()
        self._interval_start_ns = time.time_ns()
        #: the event clock at which a tick has work (a build or an export): ticks before it
        #: return after one comparison (the pipeline ticks after every batch, ~100 times a second)
        self._due_ns = self._interval_start_ns + self.interval_ns
        self._last_clock_ns = 0
        #: (sample, its event, what goes on top of its stack or None): samples whose stacks are
        #: built together (_build)
        self._unbuilt: list[tuple[Sample, StackSampleEvent, object]] = []
        #: the pipeline thread's CPU on samples not yet reported (_report_cpu)
        self._cpu_ns = 0
        #: GPU profiles (otelbpf/profiles/gpu.py): stacks of GPU calls joined to the calls
        self.gpu = GpuProfiles(self)
        #: the kernels launch samples launched, named (otelbpf/profiles/gpu_kernels.py)
        unwinder = getattr(self.builder, "unwinder", None)
        self.kernels = KernelFrames(getattr(unwinder, "symbol_at", None), counters)
        self.kinds = tuple(kinds)
        #: the sample's kind (the record's value) -> its handler: the dispatch of on_sample
        self._handlers = {kind.record_kind: kind.handler(self) for kind in self.kinds}

    def attach(self, pipeline) -> None:
        """Handle the sampler's events in ``pipeline`` and export on its clock."""
        self.linker = pipeline.linker
        pipeline.add_handler(StackSampleEvent, self.on_sample)
        for kind in self.kinds:  # the other records a kind's programs send (off-CPU: OffCpuEnd)
            for event_type, handler in kind.events:
                pipeline.add_handler(event_type, handler(self))
        pipeline.linker.answer_observers.append(self)
        pipeline.tick_hooks.append(self.tick)
        pipeline.exit_hooks.append(self.forget)
        pipeline.finish_hooks.append(self.close)
        state = state_of(pipeline)
        if state is not None:  # the GPU calls' spans hand each call to the GPU profiles
            state.call_observer = self.gpu.on_call
            self.steps = state.steps

    # -- samples ----------------------------------------------------------

    def on_sample(self, event: StackSampleEvent) -> None:
        """A sample, to its kind's handler; one of a kind the table does not know is counted
        (``otelbpf.profiles.samples.unknown_kind``) and dropped."""
        started = thread_time_ns()
        self._last_clock_ns = max(self._last_clock_ns, event.ts_ns)
        handle = self._handlers.get(event.kind)
        if handle is None:
            self.counters.add("otelbpf.profiles.samples.unknown_kind")
        else:
            handle(event)
        self._cpu_ns += thread_time_ns() - started

    def linked(self, profile, values, leaf=None):
        """A handler (kinds.py) for samples linked when they come, to the span their thread
        (or task) serves then: each a sample of ``profile`` weighing ``values(event)``
        (on-CPU samples, sampled GPU launches). ``leaf(event, frames) -> frames``: what goes on
        top of its stack once built (a launch's kernel)."""
        add, serving = self._add, self.serving

        def handle(event: StackSampleEvent) -> None:
            add(event, profile, values(event), serving(event), leaf)

        return handle

    def on_blocked(self, event: StackSampleEvent) -> None:
        """An off-CPU sample, linked to the span it blocked in (a request or an engine step),
        held until its thread runs again: its OffCpuEnd says for how long."""
        self._hold_blocked(event, self.serving(event))

    def serving(self, event: StackSampleEvent):
        """The span a CPU, off-CPU or launch sample belongs to: its thread's (or task's) request
        (``Linker.serving``); on a thread serving none, outside an asyncio task that may
        still learn its request, the engine step the thread is running then."""
        start = self.linker.serving(event.pid, event.tid, event.task_id)
        if start is None and self.steps is not None and not (event.task_id and self.linker.serves_requests(event.pid)):
            start = self.steps.serving(event.pid, event.tid, event.ts_ns)
        return start

    def on_offcpu_end(self, end: OffCpuEnd) -> None:
        held = self._blocked.pop(end.tid, None)
        if held is None or held[0].switch_out_ns != end.switch_out_ns:
            self.counters.add("otelbpf.profiles.offcpu.unmatched")
            if held is not None:
                self._blocked[end.tid] = held
            return
        started = thread_time_ns()
        event, start = held
        self._add(event, OFF_CPU, (end.blocked_ns,), start)
        self._cpu_ns += thread_time_ns() - started

    def _hold_blocked(self, event: StackSampleEvent, start) -> None:
        if self._blocked.pop(event.tid, None) is not None:
            self.counters.add("otelbpf.profiles.offcpu.short")  # woke before the minimum
        self._blocked[event.tid] = (event, start)
        if len(self._blocked) > MAX_BLOCKED_THREADS:
            self._blocked.popitem(last=False)
            self.counters.add("otelbpf.profiles.offcpu.evicted")

    def _add(self, event: StackSampleEvent, profile, values: tuple[int, ...], start, leaf=None) -> None:
        if len(self._interval) >= MAX_INTERVAL_SAMPLES:
            self.counters.add("otelbpf.profiles.samples.dropped")
            return
        sample = Sample(profile, event.pid, event.tid, event.ts_ns, (), values, thread_name=event.comm)
        self._unbuilt.append((sample, event, leaf))
        if len(self._unbuilt) == 1:
            self._due_ns = min(self._due_ns, event.ts_ns + BUILD_DELAY_NS)
        elif len(self._unbuilt) >= BUILD_BATCH:
            self._build()
        self.counters.add("otelbpf.profiles.samples", label=profile.id)
        if start is None and event.task_id and self.linker.serves_requests(event.pid):
            self._await_task(sample, event.task_id)
            return
        self._interval.append((sample, start))

    # -- GPU profiles (otelbpf/profiles/gpu.py) ----------------------------

    @property
    def last_clock_ns(self) -> int:
        return self._last_clock_ns

    def add_gpu_sample(self, profile, call, frames, values, link, thread_name, attributes) -> None:
        """A GPU call's sample; ``link``: the span it is linked to (read at export)."""
        if len(self._interval) >= MAX_INTERVAL_SAMPLES:
            self.counters.add("otelbpf.profiles.samples.dropped")
            return
        self._last_clock_ns = max(self._last_clock_ns, call.end_ns)
        sample = Sample(profile, call.pid, call.tid, call.ts_ns, frames, values, thread_name=thread_name,
                        attributes=attributes)  # fmt: skip
        self.counters.add("otelbpf.profiles.samples", label=profile.id)
        self._interval.append((sample, link))

    def add_snapshot(self, sample: Sample, link) -> None:
        """An in-use sample (taken at export: not bounded by the interval's sample cap)."""
        self._interval.append((sample, link))

    # -- asyncio tasks ----------------------------------------------------

    def _await_task(self, sample: Sample, task_id: int) -> None:
        key = (sample.pid, task_id)
        waiting = self._by_task.get(key)
        if waiting is None:
            waiting = self._by_task[key] = []
        waiting.append(sample)
        self._task_samples += 1
        if self._task_samples > MAX_TASK_SAMPLES:
            self._release_tasks(everything=False, oldest=True)

    def answered(self, start, ts_ns: int, task_id: int) -> None:
        """The Linker's hook: ``task_id`` wrote the response of ``start``'s
        request at ``ts_ns``; its samples since the request began are that
        request's."""
        waiting = self._by_task.get((start.pid, task_id))
        if not waiting:
            return
        keep = []
        for sample in waiting:
            if start.start_ns <= sample.time_unix_nano <= ts_ns:
                self._interval.append((sample, start))
                self._task_samples -= 1
            else:
                keep.append(sample)
        if keep:
            self._by_task[(start.pid, task_id)] = keep
        else:
            del self._by_task[(start.pid, task_id)]

    def _release_tasks(self, everything: bool, oldest: bool = False) -> None:
        """Task samples whose answer did not come go unlinked."""
        cutoff = self._last_clock_ns - TASK_SAMPLE_WAIT_NS
        for key in list(self._by_task):
            waiting = self._by_task[key]
            if everything or oldest or waiting[-1].time_unix_nano < cutoff:
                del self._by_task[key]
                self._task_samples -= len(waiting)
                self.counters.add("otelbpf.profiles.samples.unanswered", len(waiting))
                self._interval.extend((sample, None) for sample in waiting)
                if oldest:
                    return

    # -- export -----------------------------------------------------------

    def _build(self) -> None:
        """The stacks of the samples held unbuilt (BUILD_BATCH), one after another. A stack
        depends on the sample alone (its registers, stack copy, Python frame records and kernel
        stack, all taken by the kernel) and on the process's code, which a build a quarter of
        a second later reads as a build at once would (code objects are re-read at most
        REVERIFY_S apart anyway); the link was decided when the sample came."""
        frames = self.builder.frames
        for sample, event, leaf in self._unbuilt:
            sample.frames = frames(event) if leaf is None else leaf(event, frames(event))
        self._unbuilt = []
        self._due_ns = self._interval_start_ns + self.interval_ns

    def tick(self, ts_ns: int, everything: bool) -> None:
        """The pipeline's clock moved (every drain under traffic): export the interval when it
        is due. Most ticks have nothing to build or export: they return after one comparison
        (``_due_ns``, kept by _add, _build and flush)."""
        if ts_ns > self._last_clock_ns:
            self._last_clock_ns = ts_ns
        if ts_ns < self._due_ns and not everything:
            return
        build = self._unbuilt and ts_ns - self._unbuilt[0][1].ts_ns >= BUILD_DELAY_NS
        export = everything or ts_ns - self._interval_start_ns >= self.interval_ns
        if build or export:
            started = thread_time_ns()
            if build:
                self._build()
            if export:
                self.flush(ts_ns, everything)
            self._cpu_ns += thread_time_ns() - started
            self._report_cpu(everything)

    def _report_cpu(self, everything: bool = False) -> None:
        """The pipeline thread's CPU spent on samples, into ``otelbpf.profiles.cpu_time{pipeline}``
        (microseconds): decoding them (the sampler's), linking and building their stacks, and
        handing intervals to the exporters. Reported once a millisecond has gathered, so the
        counter's lock is not taken per sample."""
        sampler_ns = getattr(self.sampler, "cpu_ns", 0)
        spent = self._cpu_ns + sampler_ns
        if spent < CPU_REPORT_NS and not (everything and spent >= 1000):
            return
        if sampler_ns:
            self.sampler.cpu_ns = 0
        self._cpu_ns = spent % 1000  # the sub-microsecond rest stays for the next report
        self.counters.add(CPU_TIME, spent // 1000, label="pipeline")

    def flush(self, now_ns: int | None = None, everything: bool = False) -> None:
        now_ns = now_ns or time.time_ns()
        if self._unbuilt:
            self._build()
        self._release_tasks(everything)
        self.gpu.snapshot(now_ns)
        interval, self._interval = self._interval, []
        start_ns, self._interval_start_ns = self._interval_start_ns, now_ns
        self._due_ns = now_ns + self.interval_ns  # nothing unbuilt: built above
        if not interval:
            return
        samples = [_linked(sample, start) for sample, start in interval]
        resources = {pid: dict(self.resources.attributes(pid)) for pid in {s.pid for s in samples}}
        for exporter in self.exporters:
            try:
                exporter.export(samples, resources)
            except Exception:  # noqa: BLE001 - one sink failing must not stop the others
                log.exception("profiles: exporter %s failed", type(exporter).__name__)
        log.debug("profiles: exported %d samples of %.1f s", len(samples), (now_ns - start_ns) / 1e9)

    def forget(self, pid: int) -> None:
        if self._unbuilt:  # while the builder still knows the process
            started = thread_time_ns()
            self._build()
            self._cpu_ns += thread_time_ns() - started
        self.builder.forget(pid)
        self.gpu.forget(pid)
        self.kernels.forget(pid)

    def close(self) -> None:
        """The agent stops: what is held leaves, and the exporters finish (the flame graph is written)."""
        started = thread_time_ns()
        self.flush(everything=True)
        self._cpu_ns += thread_time_ns() - started
        self._report_cpu(everything=True)
        unwinder = getattr(self.builder, "unwinder", None)
        stats = unwinder.stats if unwinder is not None and getattr(unwinder, "verify", False) else {}
        if stats.get("verified"):  # OTELBPF_PROFILES_VERIFY_UNWIND=1 (otelbpf/profiles/stacks.py)
            self.counters.add("otelbpf.profiles.unwind.verified", stats["verified"])
            self.counters.add("otelbpf.profiles.unwind.verify_mismatches", stats.get("verify_mismatches", 0))
        for exporter in self.exporters:
            try:
                exporter.shutdown()
            except Exception:  # noqa: BLE001
                log.exception("profiles: exporter %s failed to shut down", type(exporter).__name__)


def _linked(sample: Sample, start) -> Sample:
    """The sample with the trace and span ids of ``start`` (read now: final)."""
    if start is not None:
        sample.trace_id = start.trace_id
        sample.span_id = start.span_id
    return sample
