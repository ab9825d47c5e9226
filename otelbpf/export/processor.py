"""Batches finished spans and feeds every sink from its own thread and queue.

``BatchSpanProcessor`` is the generic ``otelbpf.otlp.queue.BatchQueue``
(per-sink bounded queues, retries with backoff, oldest dropped first, exact
delivered/dropped accounting, flush and shutdown within a timeout: see
there) for spans:

* batches are ``SpanBatch``es, shared by every sink and so encoded once;
  when every sink reads only their ``payload`` (the OTLP sinks), each span
  of a batch is encoded when the batch is sealed instead (on the pipeline's
  thread when it fills there) and the records are freed there
  (``EncodedSpanBatch``): reading and freeing them on the export thread,
  another CPU, cost the agent up to several microseconds a span, the more
  so on a busy machine (bench/README.md);
* ``on_end`` is the hot-path entry; a span whose ids or grouping keys the
  encoder cannot take is dropped and counted at once;
* counters ``otelbpf.export.spans`` (delivered), ``otelbpf.export.dropped``
  and ``otelbpf.export.failures`` (attempts), labelled with the sink name.

Settings: constructor argument, else OTEL_BSP_MAX_QUEUE_SIZE,
OTEL_BSP_MAX_EXPORT_BATCH_SIZE, OTEL_BSP_SCHEDULE_DELAY (milliseconds), else
65536 spans, 512 spans, 1 s.
"""

from __future__ import annotations

from typing import Sequence

from otelbpf.core.model import ResourceLookup, SpanRecord
from otelbpf.core.selfmetrics import Counters
from otelbpf.export.sinks import EncodedSpanBatch, SpanBatch, SpanSink
from otelbpf.export.encode import wire_part
from otelbpf.otlp.queue import BatchQueue, CounterNames, RetryPolicy, setting

DEFAULT_MAX_QUEUE_SIZE = 65536
DEFAULT_MAX_BATCH_SIZE = 512
DEFAULT_SCHEDULE_DELAY_S = 1.0

SPANS = "otelbpf.export.spans"
DROPPED = "otelbpf.export.dropped"
FAILURES = "otelbpf.export.failures"


class BatchSpanProcessor(BatchQueue):
    """Collects spans from ``on_end`` and exports them in batches to each sink."""

    def __init__(
        self,
        sinks: Sequence[SpanSink],
        resources: ResourceLookup,
        counters: Counters,
        max_queue_size: int | None = None,
        max_batch_size: int | None = None,
        schedule_delay_s: float | None = None,
        *,
        initial_backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
    ) -> None:
        #: Batches are encoded as they are sealed: no sink reads the records.
        self.encodes_at_seal = bool(sinks) and all(getattr(sink, "reads_payload_only", False) for sink in sinks)
        super().__init__(
            sinks,
            counters,
            (lambda spans: EncodedSpanBatch([wire_part(span) for span in spans], resources))
            if self.encodes_at_seal
            else (lambda spans: SpanBatch(spans, resources)),
            max_queue_size=setting("max_queue_size", max_queue_size, "OTEL_BSP_MAX_QUEUE_SIZE", DEFAULT_MAX_QUEUE_SIZE),
            max_batch_size=setting(
                "max_batch_size", max_batch_size, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", DEFAULT_MAX_BATCH_SIZE
            ),
            schedule_delay_s=setting(
                "schedule_delay_s", schedule_delay_s, "OTEL_BSP_SCHEDULE_DELAY", DEFAULT_SCHEDULE_DELAY_S, env_unit=0.001
            ),
            retry=RetryPolicy(initial_s=initial_backoff_s, max_s=max_backoff_s),
            accept=is_exportable,
            counter_names=CounterNames(delivered=SPANS, dropped=DROPPED, failures=FAILURES),
            noun="spans",
        )

    #: Queue a finished span (``BatchQueue.add`` itself: no extra call on the hot path).
    #: O(1), never blocks on I/O, never raises.
    on_end = BatchQueue.add


def is_exportable(span: SpanRecord) -> bool:
    """Ids of the right size (a collector rejects a whole request over one bad id), and keys the encoder groups by."""
    trace_id, span_id, parent_span_id = span.trace_id, span.span_id, span.parent_span_id
    return (
        type(trace_id) is bytes
        and len(trace_id) == 16
        and type(span_id) is bytes
        and len(span_id) == 8
        and type(parent_span_id) is bytes
        and len(parent_span_id) in (0, 8)
        and type(span.pid) is int
        and type(span.scope) is str
    )
