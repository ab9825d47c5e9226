"""CUDA and NCCL calls as spans.

Each call the GPU probes report (a CallEvent whose ``library`` is ``cuda`` or
``nccl``) becomes a span named by the API function, its arguments decoded
into attributes (where each function keeps them:
otelbpf/semantics/gpu_functions.py). Building it is also when the call is
booked with the pipeline's :class:`~otelbpf.semantics.gpu_state.GpuState`: the
kernel launches it carries, a short CUDA call folded, the memory a process
pinned and allocated, an NCCL collective matched across ranks. How the calls,
their launches and the request spans fit together: otelbpf/semantics/gpu.py.
"""

from __future__ import annotations

from otelbpf import semconv as sc
from otelbpf.core.events import CallEvent
from otelbpf.core.identity import SpanStart
from otelbpf.core.model import AttributeValue, SpanRecord, StatusCode
from otelbpf.semantics.common import CallSemantics
from otelbpf.semantics.gpu_functions import (
    CUDA_BLOCKING_COPIES,
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
    NCCL_ORDERED_COLLECTIVES,
    NCCL_REDUCE_OPS,
    as_c_int,
    decode_comm_init,
)
from otelbpf.semantics.gpu_state import GpuState, bounded_put
from protocols.nccl.comm_hash import format_comm_hash

#: ncclResult_t of a non-blocking communicator's set-up still in progress (the handle is valid)
NCCL_IN_PROGRESS = 7


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


class CudaCalls(CallSemantics):
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
        if name_waits_for_gpu(call.function, attrs):
            self.state.intervals.gpu_wait(call)
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


def name_waits_for_gpu(name: str, attrs: dict[str, AttributeValue]) -> bool:
    """Whether the calling thread waited for the GPU in this call: a synchronisation, a blocking
    copy, or an async copy from pageable memory (synchronous in effect)."""
    return name in CUDA_SYNCS or name in CUDA_BLOCKING_COPIES or attrs.get(sc.OTELBPF_GPU_MEMCPY_PAGEABLE) is True


# -- NCCL -------------------------------------------------------------------------------------


class NcclCalls(CallSemantics):
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
                if name in NCCL_ORDERED_COLLECTIVES:
                    self._place(start, call, name[4:], args[comm_i], attrs)
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
                if as_c_int(call.ret) in (0, NCCL_IN_PROGRESS):
                    comm = self.state.collectives.joined(
                        call.pid, call.out0, call.payload, rank, nranks, self.state.nccl_version(call.pid)
                    )
                    if comm is not None:
                        attrs[sc.OTELBPF_NCCL_COMM_HASH] = format_comm_hash(comm)
        elif name == "ncclCommDestroy":
            attrs[sc.OTELBPF_NCCL_COMMUNICATOR] = f"{args[0]:x}"
            self.state.stragglers.left(call.pid, args[0])
            self.state.collectives.left(call.pid, args[0])
        result = as_c_int(call.ret)
        if result:
            attrs[sc.OTELBPF_NCCL_RESULT] = result
            attrs[sc.ERROR_TYPE] = str(result)
        span = _finish(start, call, self.library, attrs, f"NCCL result {result}" if result else "")
        if self.state.call_observer is not None:
            self.state.call_observer(start, call, attrs)
        return span

    def _place(self, start: SpanStart, call: CallEvent, operation: str, handle: int,
               attrs: dict[str, AttributeValue]) -> None:  # fmt: skip
        """An ordered collective: its instance across ranks and nodes (its span moves to that
        trace on its way out), and the rank's time since its previous collective."""
        state = self.state
        instance, unjoined = state.collectives.instance(call, operation, handle)
        if instance is not None:
            attrs[sc.OTELBPF_NCCL_COMM_HASH] = format_comm_hash(instance.comm)
            attrs[sc.OTELBPF_NCCL_SEQUENCE] = instance.seq
            attrs[sc.OTELBPF_NCCL_RANK] = instance.rank
            attrs[sc.OTELBPF_NCCL_NRANKS] = instance.nranks
            bounded_put(state.instances, start.span_id, instance)
        else:
            attrs[sc.OTELBPF_NCCL_UNJOINED] = unjoined
        interval = state.intervals.collective(call)
        if interval is not None:
            attrs[sc.OTELBPF_NCCL_INTERVAL_DURATION] = interval.duration
            attrs[sc.OTELBPF_NCCL_INTERVAL_GPU_WAIT] = interval.gpu_wait
            if interval.on_cpu is not None:
                attrs[sc.OTELBPF_NCCL_INTERVAL_ON_CPU] = interval.on_cpu
                attrs[sc.OTELBPF_NCCL_INTERVAL_OFF_CPU] = interval.off_cpu
