"""CUDA and NCCL calls as spans, and kernel launch counts on request spans: how
the pieces fit, and :func:`attach`, which gives them to a pipeline.

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

The pieces, in otelbpf/semantics/: gpu_functions.py (the functions traced and
where their arguments are), gpu_calls.py (the call spans), gpu_state.py (what
is remembered between calls), gpu_span_consumer.py (the request spans written
on their way out), gpu_steps.py (engine steps), nccl_lateness.py (collectives
matched across ranks).
"""

from __future__ import annotations

from otelbpf.semantics.gpu_calls import CudaCalls, NcclCalls
from otelbpf.semantics.gpu_span_consumer import GpuSpanConsumer
from otelbpf.semantics.gpu_state import GpuState, state_of
from otelbpf.semantics.gpu_steps import EngineSteps


def attach(pipeline, min_call_ns: int = 0) -> GpuState:
    """Give ``pipeline`` GPU call spans (CUDA, NCCL) and launch counts on request spans,
    through its declared hooks (otelbpf/assembly.py lists them).
    ``min_call_ns``: fold CUDA calls shorter than this (0: none; see :class:`GpuState`)."""
    existing = state_of(pipeline)
    if existing is not None:
        return existing
    state = GpuState(pipeline.counters, min_call_ns)
    pipeline.add_calls(CudaCalls(state))
    pipeline.add_calls(NcclCalls(state))
    consumer = pipeline.wrap_consumer(lambda inner: GpuSpanConsumer(inner, state))
    attach_steps(pipeline, state)
    # after the steps' hook: a step flushed at the end may still carry a collective
    pipeline.tick_hooks.append(consumer.tick)

    def process_exited(pid: int) -> None:
        if state.steps is not None:
            state.steps.process_exited(pid)
        state.forget(pid)

    pipeline.exit_hooks.append(process_exited)
    return state


def attach_steps(pipeline, state: GpuState, options=None) -> None:
    """GPU calls on threads that serve no request become engine steps linked to the requests in flight."""
    steps = state.steps = EngineSteps(lambda span: pipeline.consumer.on_end(span), pipeline.linker, pipeline.counters, options)
    pipeline.tick_hooks.append(steps.tick)
