"""CUDA and NCCL calls as spans, and kernel launch counts on request spans.

The GPU uprobes (otelbpf/sources/gpu.py) turn each *timeline* call (copies,
synchronisations, allocations, pinning, NCCL collectives and communicator
set-up) into a :class:`~otelbpf.core.events.CallEvent` whose ``library`` is
``cuda`` (runtime and driver) or ``nccl``. The pipeline asks the linker for
its identity (``Linker.start_call``: an INTERNAL child of the request the
thread serves, or a root when it serves none) and :class:`CudaCalls` /
:class:`NcclCalls` build the span: named by the API function
(``cudaMemcpy``, ``cuMemcpyHtoDAsync_v2``, ``ncclAllReduce``), arguments
decoded from the argument registers (which argument is where, per function:
otelbpf/semantics/gpu_functions.py).

Kernel launches are not calls here: bpf/gpu.c counts them per thread and the
thread's next timeline call carries the count (``CallEvent.launches``, with
the time of the first, and with --gpu-launch-time the time spent inside
them). :class:`GpuState` books the count under the call's parent span;
:class:`GpuSpanConsumer` writes the total on that request span
(``otelbpf.gpu.kernel_launches``, ``otelbpf.gpu.kernel_launch.duration``)
when it leaves the pipeline, counting only launches made after the request
started (a count that began before belongs partly to something else: it is
counted in ``otelbpf.gpu.launches.unattributed`` instead of being guessed).
Launches per process are read from the kernel's totals, not from here
(otelbpf/sources/gpu.py ``launch_sums``).

Short CUDA calls (under ``GpuState.min_call_ns``, --gpu-min-call-duration)
that succeeded are *folded*: their span still feeds the metrics but is not
exported; the request span gets how many there were and their time, per
function (``otelbpf.gpu.folded_calls.*``). NCCL calls are never folded: an
enqueue is short, few are made per step, and each carries its rank's
lateness (otelbpf/semantics/nccl_lateness.py).

Calls from an asyncio task wait for their parent decision (the request the
task answers), and so do their launches (:meth:`GpuState.settle_deferred`,
run before that request span is written); bpf/gpu.c counts launches per
(thread, task). Calls on a thread that serves no request are grouped into
engine steps linked to the requests in flight (otelbpf/semantics/gpu_steps.py).

Pageable copies: a host pointer not inside memory the agent saw pinned
(cudaHostAlloc, cudaMallocHost, cudaHostRegister, cuMemHostAlloc...) in that
process. Memory pinned before the agent started looks pageable: say so in
docs/gpu.md.
"""

from __future__ import annotations

from otelbpf import semconv as sc
from otelbpf.core.events import CallEvent
from otelbpf.core.identity import SpanStart
from otelbpf.core.model import AttributeValue, SpanRecord, StatusCode
from otelbpf.semantics.gpu_functions import (
    CUDA_COPIES,
    CUDA_DEVICE_ALLOCS,
    CUDA_DEVICE_FREES,
    CUDA_HOST_ALLOCS,
    CUDA_HOST_FREES,
    CUDA_HOST_REGISTERS,
    CUDA_SYNCS,
    MEMCPY_KINDS,
    NCCL_COLLECTIVES,
    NCCL_COMM_INITS,
    NCCL_DATATYPES,
    NCCL_REDUCE_OPS,
    as_c_int,
    decode_comm_init,
)
from otelbpf.semantics.gpu_state import GpuState, bounded_put, state_of
from otelbpf.semantics.gpu_steps import EngineSteps

def _finish(start: SpanStart, call: CallEvent, scope: str, attrs: dict[str, AttributeValue], failed: str) -> SpanRecord:
    attrs[sc.CODE_FUNCTION_NAME] = call.function
    attrs[sc.THREAD_ID] = start.tid
    if start.association:
        attrs[sc.OTELBPF_ASSOCIATION] = start.association
    return SpanRecord(
        trace_id=start.trace_id,
        span_id=start.span_id,
        parent_span_id=start.parent_span_id,
        name=call.function,
        kind=start.kind,
        start_ns=call.ts_ns,
        end_ns=max(call.end_ns, call.ts_ns),
        pid=start.pid,
        attributes=attrs,
        status_code=StatusCode.ERROR if failed else StatusCode.UNSET,
        status_message=failed,
        trace_state=start.trace_state,
        scope=f"otelbpf.{scope}",
        protocol=scope,
    )


# -- CUDA -------------------------------------------------------------------------------------


class CudaCalls:
    """CUDA runtime and driver calls (``CallEvent.library == "cuda"``) as spans."""

    library = sc.OTELBPF_SCOPE_CUDA

    def __init__(self, state: GpuState) -> None:
        self.state = state
        self.place_off_request = state.place_off_request  # Pipeline._on_call: engine steps

    def span(self, start: SpanStart, call: CallEvent) -> SpanRecord | None:
        self.state.book_launches(start, call)
        attrs: dict[str, AttributeValue] = {}
        args = call.args + (0,) * (6 - len(call.args))
        code = as_c_int(call.ret)
        ok = code == 0
        self._describe(call, args, ok, attrs)
        if not ok:
            attrs[sc.OTELBPF_GPU_ERROR_CODE] = code
            attrs[sc.ERROR_TYPE] = str(code)  # the error code: few values, as error.type asks
        span = _finish(start, call, self.library, attrs, "" if ok else f"CUDA error {code}")
        if self.state.min_call_ns:
            self.state.fold(start, span)
        if self.state.call_observer is not None:
            self.state.call_observer(start, call, attrs)
        return span

    def _describe(self, call: CallEvent, args: tuple[int, ...], ok: bool, attrs: dict[str, AttributeValue]) -> None:
        name = call.function
        memory = self.state.memory(call.pid)
        if name in CUDA_COPIES:
            dst_i, src_i, count_i, kind, stream_i = CUDA_COPIES[name]
            kind_code = args[kind[1]] if isinstance(kind, tuple) else kind
            kind_name = MEMCPY_KINDS.get(kind_code, "unknown")
            attrs[sc.OTELBPF_GPU_MEMCPY_KIND] = kind_name
            attrs[sc.OTELBPF_GPU_MEMCPY_BYTES] = args[count_i]
            host = args[src_i] if kind_name == "host_to_device" else args[dst_i] if kind_name == "device_to_host" else 0
            if host:
                attrs[sc.OTELBPF_GPU_MEMCPY_PAGEABLE] = not memory.is_pinned(host)
            if stream_i is not None:
                attrs[sc.OTELBPF_GPU_STREAM] = args[stream_i]
        elif name in CUDA_DEVICE_ALLOCS:
            size_i, stream_i = CUDA_DEVICE_ALLOCS[name]
            attrs[sc.OTELBPF_GPU_MEMORY_BYTES] = args[size_i]
            if ok and call.out0:
                attrs[sc.OTELBPF_GPU_MEMORY_ADDRESS] = call.out0
                memory.allocate(call.out0, args[size_i])
            if stream_i is not None:
                attrs[sc.OTELBPF_GPU_STREAM] = args[stream_i]
        elif name in CUDA_DEVICE_FREES:
            attrs[sc.OTELBPF_GPU_MEMORY_ADDRESS] = args[0]
            size = memory.release(args[0]) if ok else None
            if size is not None:
                attrs[sc.OTELBPF_GPU_MEMORY_BYTES] = size
            stream_i = CUDA_DEVICE_FREES[name]
            if stream_i is not None:
                attrs[sc.OTELBPF_GPU_STREAM] = args[stream_i]
        elif name in CUDA_HOST_ALLOCS:
            size = args[CUDA_HOST_ALLOCS[name]]
            attrs[sc.OTELBPF_GPU_MEMORY_BYTES] = size
            if ok and call.out0:
                attrs[sc.OTELBPF_GPU_MEMORY_ADDRESS] = call.out0
                memory.pin(call.out0, size)
        elif name in CUDA_HOST_REGISTERS:
            addr_i, size_i = CUDA_HOST_REGISTERS[name]
            attrs[sc.OTELBPF_GPU_MEMORY_ADDRESS] = args[addr_i]
            attrs[sc.OTELBPF_GPU_MEMORY_BYTES] = args[size_i]
            if ok:
                memory.pin(args[addr_i], args[size_i])
        elif name in CUDA_HOST_FREES:
            attrs[sc.OTELBPF_GPU_MEMORY_ADDRESS] = args[0]
            if ok:
                memory.unpin(args[0])
        elif name in CUDA_SYNCS:
            stream_i = CUDA_SYNCS[name]
            if stream_i is not None:
                attrs[sc.OTELBPF_GPU_STREAM] = args[stream_i]


# -- NCCL -------------------------------------------------------------------------------------


class NcclCalls:
    """NCCL calls (``CallEvent.library == "nccl"``) as spans."""

    library = sc.OTELBPF_SCOPE_NCCL

    def __init__(self, state: GpuState) -> None:
        self.state = state
        self.place_off_request = state.place_off_request  # Pipeline._on_call: engine steps

    def span(self, start: SpanStart, call: CallEvent) -> SpanRecord | None:
        self.state.book_launches(start, call)
        args = call.args + (0,) * (6 - len(call.args))
        attrs: dict[str, AttributeValue] = {}
        name = call.function
        if name in NCCL_COLLECTIVES:
            count_i, type_i, op_i, other, comm_i = NCCL_COLLECTIVES[name]
            attrs[sc.OTELBPF_NCCL_OPERATION] = name[4:]
            count = args[count_i]
            attrs[sc.OTELBPF_NCCL_COUNT] = count
            datatype = NCCL_DATATYPES.get(as_c_int(args[type_i]))
            if datatype is not None:
                attrs[sc.OTELBPF_NCCL_DATATYPE] = datatype[0]
                attrs[sc.OTELBPF_NCCL_BYTES] = count * datatype[1]
            if op_i is not None:
                attrs[sc.OTELBPF_NCCL_REDUCE_OP] = NCCL_REDUCE_OPS.get(as_c_int(args[op_i]), "custom")
            if other is not None:
                attrs[other[0]] = as_c_int(args[other[1]])
            if comm_i is not None:
                attrs[sc.OTELBPF_NCCL_COMMUNICATOR] = f"{args[comm_i]:x}"
                entry = self.state.stragglers.enter(call.pid, args[comm_i], name[4:], call.ts_ns)
                if entry is not None:
                    attrs[sc.OTELBPF_NCCL_UNIQUE_ID] = entry.unique_id
                    attrs[sc.OTELBPF_NCCL_RANK] = entry.rank
                    if self.state.stragglers.may_all_be_here(entry):
                        bounded_put(self.state.entries, start.span_id, entry)  # held until its collective is whole
        elif name in NCCL_COMM_INITS:
            nranks, rank, unique_id = decode_comm_init(args)
            attrs[sc.OTELBPF_NCCL_NRANKS] = nranks
            attrs[sc.OTELBPF_NCCL_RANK] = rank
            if unique_id:
                attrs[sc.OTELBPF_NCCL_UNIQUE_ID] = unique_id
            if call.out0:
                attrs[sc.OTELBPF_NCCL_COMMUNICATOR] = f"{call.out0:x}"
                if unique_id and as_c_int(call.ret) == 0:
                    self.state.stragglers.joined(call.pid, call.out0, unique_id, rank, nranks, call.ts_ns)
        elif name == "ncclCommDestroy":
            attrs[sc.OTELBPF_NCCL_COMMUNICATOR] = f"{args[0]:x}"
            self.state.stragglers.left(call.pid, args[0])
        result = as_c_int(call.ret)
        if result:
            attrs[sc.OTELBPF_NCCL_RESULT] = result
            attrs[sc.ERROR_TYPE] = str(result)
        span = _finish(start, call, self.library, attrs, f"NCCL result {result}" if result else "")
        if self.state.call_observer is not None:
            self.state.call_observer(start, call, attrs)
        return span


# -- wiring -----------------------------------------------------------------------------------


class GpuSpanConsumer:
    """Wraps a pipeline's span consumer for the GPU spans' sake:

    * a request span under which GPU calls booked kernel launches leaves with
      ``otelbpf.gpu.kernel_launches`` (and ``otelbpf.gpu.kernel_launch.duration``
      when the launches were timed), and with the calls folded under it;
    * a folded call's span goes to the span metrics only;
    * an NCCL collective span of a communicator whose ranks are all traced
      here waits in the hold until its collective is whole, and leaves marked.
    """

    def __init__(self, consumer, state: GpuState) -> None:
        self._consumer = consumer
        self.state = state
        metrics = getattr(consumer, "span_metrics", None)
        self._record_only = metrics.record if metrics is not None else None
        self._consumer_on_end = consumer.on_end

    def on_end(self, span: SpanRecord) -> None:
        state = self.state
        if not (state.deferred or state.folded or state.entries or state.launches or state.folds
                or state.holds.collectives):
            # nothing GPU pending (always so for a host without GPU calls): one check, no _pass frame
            self._consumer_on_end(span)
            return
        if state.deferred:
            state.settle_deferred()
        if state.folded and span.span_id in state.folded:
            del state.folded[span.span_id]
            if self._record_only is not None:
                self._record_only(span)
            return
        entry = state.entries.pop(span.span_id, None) if state.entries else None
        if entry is not None:
            for ready in state.holds.add(span, entry):
                self._pass(ready)
        else:
            self._pass(span)
        if state.holds.collectives:
            for late in state.holds.expire(now_ns=span.end_ns):
                self._pass(late)

    def tick(self, now_ns: int, final: bool) -> None:
        """After each batch: collectives held past the timeout leave, even on an idle agent;
        when the pipeline finishes, every held span leaves (unmarked when its collective is not whole)."""
        if self.state.holds.collectives:
            for held in self.state.holds.expire(everything=final, now_ns=now_ns):
                self._pass(held)

    def _pass(self, span: SpanRecord) -> None:
        state = self.state
        if state.launches:
            taken = state.take_launches(span)
            if taken is not None:
                launches, spent_ns = taken
                span.attributes[sc.OTELBPF_GPU_KERNEL_LAUNCHES] = launches
                if spent_ns:
                    span.attributes[sc.OTELBPF_GPU_KERNEL_LAUNCH_DURATION] = spent_ns
        if state.folds:
            folds = state.take_folds(span)
            if folds is not None:
                functions = sorted(folds)
                span.attributes[sc.OTELBPF_GPU_FOLDED_CALLS_FUNCTION] = functions
                span.attributes[sc.OTELBPF_GPU_FOLDED_CALLS_COUNT] = [folds[f][0] for f in functions]
                span.attributes[sc.OTELBPF_GPU_FOLDED_CALLS_DURATION] = [folds[f][1] for f in functions]
        self._consumer_on_end(span)

    def __getattr__(self, name):
        return getattr(self._consumer, name)


def attach(pipeline, min_call_ns: int = 0) -> GpuState:
    """Give ``pipeline`` GPU call spans (CUDA, NCCL) and launch counts on request spans.
    ``min_call_ns``: fold CUDA calls shorter than this (0: none; see :class:`GpuState`)."""
    existing = state_of(pipeline)
    if existing is not None:
        return existing
    state = GpuState(pipeline.counters, min_call_ns)
    pipeline.registry.register_calls(CudaCalls(state))
    pipeline.registry.register_calls(NcclCalls(state))
    consumer = pipeline.consumer = GpuSpanConsumer(pipeline.consumer, state)
    attach_steps(pipeline, state)
    # after the steps' hook: a step flushed at the end may still carry a collective
    pipeline.tick_hooks.append(consumer.tick)
    exited = pipeline.on_process_exit

    def on_process_exit(pid: int) -> None:
        if state.steps is not None:
            state.steps.process_exited(pid)
        state.forget(pid)
        if exited is not None:
            exited(pid)

    pipeline.on_process_exit = on_process_exit
    return state


def attach_steps(pipeline, state: GpuState, options=None) -> None:
    """GPU calls on threads that serve no request become engine steps linked to the requests in flight."""
    steps = state.steps = EngineSteps(lambda span: pipeline.consumer.on_end(span), pipeline.linker, pipeline.counters, options)
    pipeline.tick_hooks.append(steps.tick)
