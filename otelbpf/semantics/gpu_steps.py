"""Engine steps: GPU work that serves many requests at once, as spans with links.

A continuous-batching engine (vLLM's engine core process, a batching worker
thread) runs the GPU for every request in flight at once, on a thread that
read none of them. No rule of otelbpf.association can give such a call a
parent, and none should: the work belongs to many requests. So the calls no
rule places are grouped per thread into *steps*, each an INTERNAL span of its
own trace (``gpu step``), never a request's child, with a span link to every
request in flight at any time during it; the calls are the step's children
and the launches they carry are counted on it.

A step, per thread:

- begins with the first GPU call (or the first kernel launch that call
  carries) after the thread's previous step ended;
- ends when a synchronisation returns (stream, device, context or event
  sync: where an engine waits for its batch), when no call or launch came
  for ``gap_ns`` (the step ends at its last call), when it would exceed
  ``max_duration_ns`` (cut; the next call begins a new step), or when its
  process exits or the agent stops.

Links (scope): server spans open at any time during the step (started
before its end, not ended before its start) in the step's process, in the
process that started it (its parent: vLLM's API server starts its engine
core) and in the processes it started (its children). Other processes of the
host are never linked: a launcher's other children may be unrelated
services. At most ``max_links`` links per step, the earliest requests first;
the rest are counted on the span (``otelbpf.gpu.step.links_dropped``) and in
``otelbpf.gpu.step.links_dropped``.

Requests are followed (``Linker.window_observers``) from the first step on,
starting with those open then: a host with no batching engine pays nothing
per request.

A step is built a little after it ends (when the pipeline's clock passed its
end by ``FINALIZE_GRACE_NS``): events are sorted by time within a short
window, and a request that started just before the end may be handled after
the synchronisation that ended the step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from otelbpf import semconv as sc
from otelbpf.core.events import CallEvent
from otelbpf.core.identity import SpanStart, TraceGroup
from otelbpf.core.model import SpanKind, SpanLink, SpanRecord, new_span_id, new_trace_id
from otelbpf.host.procfs import parent_of
from otelbpf.semantics.gpu_functions import CUDA_SYNCS

#: Functions that end a step when they return (the synchronisations): the engine waits for its batch there.
SYNC_FUNCTIONS = frozenset(CUDA_SYNCS)
#: A step is built once the pipeline's clock is this far past its end (reordering window + margin).
FINALIZE_GRACE_NS = 20_000_000
#: Ended requests remembered per process for steps still open (the oldest go first), and
#: at least this long (a step's first call may be handled after requests that ended during it).
MAX_ENDED_REQUESTS = 4096
ENDED_REQUESTS_KEPT_NS = 1_000_000_000
#: Threads with a step open or ending, at most (beyond: the oldest open step is ended).
MAX_OPEN_STEPS = 4096

SCOPE_FAMILY = "family"
SCOPE_PROCESS = "process"


@dataclass
class StepOptions:
    """How steps are cut and linked (``otelbpf run --gpu-step-*``)."""

    #: No GPU call or launch for this long ends a step.
    gap_ns: int = 20_000_000
    #: A step longer than this is cut.
    max_duration_ns: int = 10_000_000_000
    #: Links per step span, at most.
    max_links: int = 128
    #: ``family`` (the step's process, its parent and children) or ``process`` (its own only).
    scope: str = SCOPE_FAMILY


@dataclass
class _Step:
    start: SpanStart
    start_ns: int
    last_ns: int
    calls: int = 0
    end_ns: int = 0
    end_reason: str = ""


@dataclass(slots=True)
class _Ended:
    """A request that ended: enough to link it."""

    start_ns: int
    end_ns: int
    group: TraceGroup
    span_id: bytes

    @property
    def trace_id(self) -> bytes:
        return self.group.trace_id


@dataclass
class _Requests:
    """One process's server spans: those open, and those ended lately (with their end)."""

    open: dict[int, SpanStart] = field(default_factory=dict)
    ended: deque = field(default_factory=deque)


class EngineSteps:
    """Groups GPU calls that no rule parents into step spans linked to the requests in flight.

    ``emit`` receives each finished step span (the pipeline's consumer, so the
    launch count its calls booked is written on it)."""

    def __init__(self, emit: Callable[[SpanRecord], None], linker=None, counters=None,
                 options: StepOptions | None = None, parent_of: Callable[[int], int | None] = parent_of) -> None:
        self.emit = emit
        #: The pipeline's Linker: watched (window_observers) from the first step on, so
        #: that a host with no batching engine pays nothing per request.
        self.linker = linker
        self._watching = False
        self.counters = counters
        self.options = options or StepOptions()
        self.parent_of = parent_of
        #: (pid, tid) -> the thread's open step
        self._open: dict[tuple[int, int], _Step] = {}
        #: steps ended, waiting for FINALIZE_GRACE_NS to pass
        self._ending: list[_Step] = []
        self._requests: dict[int, _Requests] = {}
        #: pid -> its parent pid (read once per process)
        self._parents: dict[int, int | None] = {}

    # -- requests in flight (Linker.window_observers) -----------------------------

    def opened(self, start: SpanStart) -> None:
        if start.kind == SpanKind.SERVER:
            self._requests_of(start.pid).open[id(start)] = start

    def closed(self, start: SpanStart, end_ns: int) -> None:
        requests = self._requests.get(start.pid)
        if requests is None or requests.open.pop(id(start), None) is None:
            return
        # what a link needs, not the span itself (its group: the trace it ends up in)
        requests.ended.append(_Ended(start.start_ns, end_ns, start.group, start.span_id))
        if len(requests.ended) > MAX_ENDED_REQUESTS:
            requests.ended.popleft()
            if self._open or self._ending:
                self._count("otelbpf.gpu.step.requests_forgotten")

    def _watch(self) -> None:
        """Start following requests: those open now, then every open and close."""
        self._watching = True
        if self.linker is not None:
            self.linker.window_observers.append(self)
            for start in self.linker.open_requests():
                self.opened(start)

    def _requests_of(self, pid: int) -> _Requests:
        requests = self._requests.get(pid)
        if requests is None:
            requests = self._requests[pid] = _Requests()
        return requests

    # -- calls ---------------------------------------------------------------------

    def place(self, call: CallEvent) -> SpanStart:
        """The identity of ``call``'s span, a child of its thread's current step."""
        if not self._watching:
            self._watch()
        key = (call.pid, call.tid)
        activity_ns = self._activity_start(call)
        step = self._open.get(key)
        if step is not None:
            if activity_ns - step.last_ns > self.options.gap_ns:
                self._end(key, step.last_ns, "idle")
                step = None
            elif call.end_ns - step.start_ns > self.options.max_duration_ns:
                self._end(key, step.last_ns, "max_duration")
                step = None
        if step is None:
            step = self._begin(key, call, activity_ns)
        step.calls += 1
        step.last_ns = max(step.last_ns, call.end_ns)
        child = SpanStart(step.start.group, new_span_id(), step.start.span_id, SpanKind.INTERNAL, call.pid, call.tid,
                          sc.OTELBPF_ASSOCIATION_GPU_STEP)
        child.start_ns = call.ts_ns
        if call.function in SYNC_FUNCTIONS:
            self._end(key, step.last_ns, "synchronize")
        return child

    def serving(self, pid: int, tid: int, ts_ns: int) -> SpanStart | None:
        """The step ``tid`` is running at ``ts_ns``, if any: a profile sample
        taken on an engine thread belongs to the step, as its GPU calls do. A
        step whose thread has been quiet for longer than the gap is over
        (it is ended lazily, at the thread's next call)."""
        step = self._open.get((pid, tid))
        if step is None or ts_ns < step.start_ns or ts_ns - step.last_ns > self.options.gap_ns:
            return None
        return step.start

    def _activity_start(self, call: CallEvent) -> int:
        """When the GPU work a call reports began: its first launch, if it carries launches."""
        if call.launches and call.first_launch_ns and call.ts_ns - call.first_launch_ns <= self.options.max_duration_ns:
            return min(call.ts_ns, call.first_launch_ns)
        return call.ts_ns

    def _begin(self, key: tuple[int, int], call: CallEvent, activity_ns: int) -> _Step:
        if len(self._open) >= MAX_OPEN_STEPS:
            oldest = next(iter(self._open))
            self._end(oldest, self._open[oldest].last_ns, "evicted")
            self._count("otelbpf.gpu.step.evicted")
        identity = SpanStart(TraceGroup(new_trace_id()), new_span_id(), b"", SpanKind.INTERNAL, call.pid, call.tid)
        identity.start_ns = activity_ns
        step = self._open[key] = _Step(identity, activity_ns, activity_ns)
        return step

    def _end(self, key: tuple[int, int], end_ns: int, reason: str) -> None:
        step = self._open.pop(key)
        step.end_ns = max(end_ns, step.start_ns)
        step.end_reason = reason
        self._ending.append(step)

    # -- time and ends ---------------------------------------------------------------

    def tick(self, now_ns: int, everything: bool = False) -> None:
        """Build the steps whose end is old enough (all of them when the agent
        stops), and end those idle for longer than the gap."""
        if self._open:
            for key, step in list(self._open.items()):
                if everything:
                    self._end(key, step.last_ns, "agent_stopped")
                elif now_ns - step.last_ns > self.options.gap_ns + FINALIZE_GRACE_NS:
                    self._end(key, step.last_ns, "idle")
        if self._ending:
            ready, waiting = [], []
            for step in self._ending:
                (ready if everything or now_ns - step.end_ns > FINALIZE_GRACE_NS else waiting).append(step)
            self._ending = waiting
            for step in ready:
                self.emit(self._span(step))
        if self._requests:
            self._prune(now_ns)

    def process_exited(self, pid: int) -> None:
        for key in [k for k in self._open if k[0] == pid]:
            self._end(key, self._open[key].last_ns, "process_exited")

    def _prune(self, now_ns: int) -> None:
        """Forget ended requests no step still open, ending or about to begin
        (its first call may be handled late: calls are submitted at return) can overlap."""
        oldest = min((s.start_ns for s in (*self._open.values(), *self._ending)), default=now_ns)
        oldest = min(oldest, now_ns - ENDED_REQUESTS_KEPT_NS)
        for pid, requests in list(self._requests.items()):
            ended = requests.ended
            while ended and ended[0].end_ns < oldest:
                ended.popleft()
            if not ended and not requests.open:
                del self._requests[pid]
                self._parents.pop(pid, None)

    # -- the span --------------------------------------------------------------------

    def _span(self, step: _Step) -> SpanRecord:
        in_flight = self.in_flight(step.start.pid, step.start_ns, step.end_ns)
        kept = in_flight[: self.options.max_links]
        dropped = len(in_flight) - len(kept)
        attrs = {
            sc.OTELBPF_GPU_STEP_CALLS: step.calls,
            sc.OTELBPF_GPU_STEP_END_REASON: step.end_reason,
            sc.OTELBPF_GPU_STEP_REQUESTS: len(in_flight),
            sc.THREAD_ID: step.start.tid,
        }
        if dropped:
            attrs[sc.OTELBPF_GPU_STEP_LINKS_DROPPED] = dropped
            self._count("otelbpf.gpu.step.links_dropped", dropped)
        self._count("otelbpf.gpu.steps")
        identity = step.start
        return SpanRecord(
            trace_id=identity.trace_id,
            span_id=identity.span_id,
            name=sc.OTELBPF_GPU_STEP_SPAN_NAME,
            kind=SpanKind.INTERNAL,
            start_ns=step.start_ns,
            end_ns=step.end_ns,
            pid=identity.pid,
            attributes=attrs,
            links=[SpanLink(request.trace_id, request.span_id) for request in kept],
            scope=f"otelbpf.{sc.OTELBPF_SCOPE_GPU_STEP}",
            protocol=sc.OTELBPF_SCOPE_GPU_STEP,
        )

    def in_flight(self, pid: int, start_ns: int, end_ns: int) -> list:
        """Server spans in ``pid``'s scope open at any time in [start_ns, end_ns], earliest
        first (each with ``start_ns``, ``trace_id`` and ``span_id``)."""
        found: list = []
        for other in self._scope(pid):
            requests = self._requests.get(other)
            if requests is None:
                continue
            found.extend(r for r in requests.open.values() if r.start_ns <= end_ns)
            found.extend(r for r in requests.ended if r.end_ns >= start_ns and r.start_ns <= end_ns)
        found.sort(key=lambda r: r.start_ns)
        return found

    def _scope(self, pid: int) -> list[int]:
        if self.options.scope == SCOPE_PROCESS:
            return [pid]
        parent = self._parent(pid)
        return [p for p in self._requests if p == pid or p == parent or self._parent(p) == pid]

    def _parent(self, pid: int) -> int | None:
        if pid not in self._parents:
            self._parents[pid] = self.parent_of(pid)
        return self._parents[pid]

    def _count(self, name: str, value: int = 1) -> None:
        if self.counters is not None:
            self.counters.add(name, value)


# -- command line (otelbpf run) ----------------------------------------------------------


def add_arguments(parser) -> None:
    """The ``--gpu-step-*`` options of ``otelbpf run``."""
    default = StepOptions()
    group = parser.add_argument_group("GPU engine steps (docs/gpu.md, \"Batching engines\")")
    group.add_argument("--gpu-step-gap-ms", type=_positive_float, default=default.gap_ns / 1e6, metavar="MS",
                       help=f"no GPU call or launch for this long ends a step (default {default.gap_ns / 1e6:g})")
    group.add_argument("--gpu-step-max-ms", type=_positive_float, default=default.max_duration_ns / 1e6, metavar="MS",
                       help=f"a step longer than this is cut (default {default.max_duration_ns / 1e6:g})")
    group.add_argument("--gpu-step-max-links", type=int, default=default.max_links, metavar="N",
                       help=f"links to requests per step span, the rest counted (default {default.max_links})")
    group.add_argument("--gpu-step-scope", choices=(SCOPE_FAMILY, SCOPE_PROCESS), default=default.scope,
                       help="requests a step links: of its process, its parent and children (family, default) "
                            "or of its own process only")


def options_from(args) -> StepOptions:
    return StepOptions(
        gap_ns=int(args.gpu_step_gap_ms * 1e6),
        max_duration_ns=int(args.gpu_step_max_ms * 1e6),
        max_links=max(0, args.gpu_step_max_links),
        scope=args.gpu_step_scope,
    )


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(text)
    return value
