"""GPU spans on their way out of the pipeline.

A GPU call's span is built when the call returns, while its request is still
being served, so what the calls booked in the
:class:`~otelbpf.semantics.gpu_state.GpuState` (kernel launches, folded short
calls) is written on the request span here, when that span leaves: this
wraps the pipeline's span consumer. It also keeps folded calls out of the
export, holds NCCL collective spans until their collective is whole
(otelbpf/semantics/nccl_lateness.py) and moves each into its collective
instance's trace (otelbpf/semantics/nccl_collectives.py). It sees every span of every protocol:
with nothing GPU pending it costs one check.
"""

from __future__ import annotations

from otelbpf import semconv as sc
from otelbpf.core.model import SpanRecord
from otelbpf.semantics.gpu_state import GpuState
from otelbpf.semantics.nccl_collectives import join_instance


class GpuSpanConsumer:
    """Wraps a pipeline's span consumer for the GPU spans' sake:

    * a request span under which GPU calls booked kernel launches leaves with
      ``otelbpf.gpu.kernel_launches`` (and ``otelbpf.gpu.kernel_launch.duration``
      when the launches were timed), and with the calls folded under it;
    * a folded call's span goes to the span metrics only;
    * an NCCL collective span of a communicator whose ranks are all traced
      here waits in the hold until its collective is whole, and leaves marked;
    * an NCCL collective span whose instance is known leaves in that instance's
      trace, linked to the span that issued it (otelbpf/semantics/nccl_collectives.py).
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
                or state.holds.collectives or state.instances):
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
        if state.instances:
            instance = state.instances.pop(span.span_id, None)
            if instance is not None:  # after the hold (keyed by the call's own span id) and any parent decision
                join_instance(span, instance)
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
