"""Batches finished spans and feeds every sink from its own thread and queue.

Design, and why:

* ``on_end`` runs on the agent's hot path, so it only appends to an open
  batch under a lock (O(1), no I/O, never raises). A full batch, or one
  older than ``schedule_delay_s``, is sealed into a ``SpanBatch`` and queued
  for every sink; sinks share the batch and thus its OTLP encoding.
* Each sink has its own worker thread and bounded queue, so a collector that
  is slow or down never delays the JSON file or the console.
* A failed export (the sink returned False) is retried with exponential
  backoff and jitter (``initial_backoff_s`` doubling up to ``max_backoff_s``),
  in order; meanwhile new batches keep queuing. A collector that comes up
  late therefore loses nothing that fits the queue.
* The queue holds at most ``max_queue_size`` spans per sink (the batch being
  retried included). Beyond that the OLDEST spans are dropped and counted.
  Spans evicted from a batch while its export is in progress are counted
  only if that export fails: if it succeeds, they were delivered.
* Every span handed to ``on_end`` ends up, per sink, in exactly one of
  ``otelbpf.export.spans`` (delivered) or ``otelbpf.export.dropped`` once
  the processor is shut down; ``otelbpf.export.failures`` counts failed
  attempts. The counters are labelled with the sink name.
* ``force_flush`` and ``shutdown`` deliver what is queued within their
  timeout; shutdown then stops retrying, counts the rest as dropped and
  interrupts exports still in progress by shutting the sinks down, so it
  never hangs past its timeout (beyond the sinks' own shutdown calls).

Settings: constructor argument, else OTEL_BSP_MAX_QUEUE_SIZE,
OTEL_BSP_MAX_EXPORT_BATCH_SIZE, OTEL_BSP_SCHEDULE_DELAY (milliseconds), else
65536 spans, 512 spans, 1 s.
"""

from __future__ import annotations

import logging
import math
import os
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from otelbpf.export.base import SpanBatch, SpanSink
from otelbpf.model import ResourceLookup, SpanRecord
from otelbpf.selfmetrics import Counters

_log = logging.getLogger(__name__)

DEFAULT_MAX_QUEUE_SIZE = 65536
DEFAULT_MAX_BATCH_SIZE = 512
DEFAULT_SCHEDULE_DELAY_S = 1.0

SPANS = "otelbpf.export.spans"
DROPPED = "otelbpf.export.dropped"
FAILURES = "otelbpf.export.failures"

_JITTER = 0.2  # backoff delays vary by +/-20% so agents restarted together do not retry in lockstep


@dataclass(eq=False)
class _Lane:
    """One sink's queue and worker state. All fields are guarded by the processor lock."""

    sink: SpanSink
    wake: threading.Condition
    backoff_s: float
    #: Sealed batches not yet taken, oldest first, with their sequence numbers.
    queue: deque[tuple[int, SpanBatch]] = field(default_factory=deque)
    #: The batch being exported or awaiting its retry.
    in_flight: tuple[int, SpanBatch] | None = None
    #: Spans queued or in flight, minus those already evicted.
    queued_spans: int = 0
    exporting: bool = False
    #: Spans of the exporting batch evicted meanwhile; dropped only if the export fails.
    evicted_while_exporting: int = 0
    #: Set by flush/shutdown: retry now instead of waiting out the backoff.
    hurry: bool = False
    #: Nothing more will be exported (drained at shutdown, or abandoned).
    finished: bool = False
    #: The sink raised from export once already (logged then; only the worker thread touches this).
    raised_before: bool = False
    thread: threading.Thread | None = None

    def oldest_sequence(self) -> float:
        if self.in_flight is not None:
            return self.in_flight[0]
        if self.queue:
            return self.queue[0][0]
        return math.inf


class BatchSpanProcessor:
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
        self._resources = resources
        self._counters = counters
        self._max_queue_size = int(
            _setting("max_queue_size", max_queue_size, "OTEL_BSP_MAX_QUEUE_SIZE", DEFAULT_MAX_QUEUE_SIZE)
        )
        batch_size = int(
            _setting("max_batch_size", max_batch_size, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", DEFAULT_MAX_BATCH_SIZE)
        )
        self._max_batch_size = min(batch_size, self._max_queue_size)
        self._schedule_delay_s = _setting(
            "schedule_delay_s", schedule_delay_s, "OTEL_BSP_SCHEDULE_DELAY", DEFAULT_SCHEDULE_DELAY_S, env_unit=0.001
        )
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max_backoff_s

        self._lock = threading.Lock()
        self._progress = threading.Condition(self._lock)  # a lane resolved (delivered/dropped) a batch
        self._open: list[SpanRecord] = []
        self._open_deadline: float | None = None
        self._next_sequence = 0
        self._closing = False
        self._shutdown_deadline = math.inf
        self._on_end_errors_logged = False
        self._lanes = [_Lane(sink, threading.Condition(self._lock), initial_backoff_s) for sink in sinks]
        for lane in self._lanes:
            lane.thread = threading.Thread(target=self._run, args=(lane,), name=f"otelbpf-export-{lane.sink.name}")
            lane.thread.daemon = True
            lane.thread.start()

    # --- hot path ------------------------------------------------------------

    def on_end(self, span: SpanRecord) -> None:
        """Queue a finished span. O(1), never blocks on I/O, never raises."""
        try:
            if not _is_exportable(span):
                self._count_for_every_sink(DROPPED, 1)
                return
            with self._lock:
                closing = self._closing
                if not closing:
                    self._add_to_open_batch(span)
            if closing:
                self._count_for_every_sink(DROPPED, 1)
        except Exception:  # noqa: BLE001 - the hot path must survive anything
            if not self._on_end_errors_logged:
                self._on_end_errors_logged = True
                _log.exception("dropping a span the export pipeline could not take (logged once)")
            self._count_for_every_sink(DROPPED, 1)

    def _add_to_open_batch(self, span: SpanRecord) -> None:
        self._open.append(span)
        if len(self._open) == 1:
            self._open_deadline = time.monotonic() + self._schedule_delay_s
            for lane in self._lanes:
                lane.wake.notify()  # idle workers now have a deadline to wait for
        if len(self._open) >= self._max_batch_size:
            self._seal_open_batch()

    # --- batches and queues (all under the lock) --------------------------------

    def _seal_open_batch(self) -> None:
        if not self._open:
            return
        batch = SpanBatch(self._open, self._resources)
        sequence = self._next_sequence
        self._next_sequence += 1
        self._open = []
        self._open_deadline = None
        for lane in self._lanes:
            lane.queue.append((sequence, batch))
            lane.queued_spans += len(batch)
            if lane.queued_spans > self._max_queue_size:
                self._evict_oldest(lane, lane.queued_spans - self._max_queue_size)
            lane.wake.notify()

    def _evict_oldest(self, lane: _Lane, count: int) -> None:
        dropped = 0
        while count > 0:
            taken, dropped_now = self._evict_from_in_flight(lane, count)
            if not taken:
                taken = dropped_now = self._evict_from_queue(lane, count)
            if not taken:
                break
            count -= taken
            dropped += dropped_now
            lane.queued_spans -= taken
        self._counters.add(DROPPED, dropped, label=lane.sink.name)
        self._progress.notify_all()

    @staticmethod
    def _evict_from_in_flight(lane: _Lane, count: int) -> tuple[int, int]:
        """Evict from the batch being retried: (spans taken, spans dropped now)."""
        if lane.in_flight is None:
            return 0, 0
        sequence, batch = lane.in_flight
        if lane.exporting:
            taken = min(count, len(batch) - lane.evicted_while_exporting)
            lane.evicted_while_exporting += taken
            return taken, 0  # counted when the export's outcome is known
        taken = min(count, len(batch))
        lane.in_flight = (sequence, batch.without_oldest(taken)) if taken < len(batch) else None
        return taken, taken

    @staticmethod
    def _evict_from_queue(lane: _Lane, count: int) -> int:
        if not lane.queue:
            return 0
        sequence, batch = lane.queue[0]
        taken = min(count, len(batch))
        if taken == len(batch):
            lane.queue.popleft()
        else:
            lane.queue[0] = (sequence, batch.without_oldest(taken))
        return taken

    # --- worker --------------------------------------------------------------

    def _run(self, lane: _Lane) -> None:
        while True:
            batch = self._next_batch(lane)
            if batch is None:
                return
            delivered = self._export(lane, batch)
            with self._lock:
                retry = self._record_outcome(lane, batch, delivered)
            if retry:
                self._back_off(lane)

    def _next_batch(self, lane: _Lane) -> SpanBatch | None:
        """The batch to export next; None when the worker should exit. Waits for work."""
        with self._lock:
            while True:
                if lane.finished:
                    return None
                if self._closing and time.monotonic() >= self._shutdown_deadline:
                    self._abandon(lane)
                    return None
                if lane.in_flight is None and lane.queue:
                    lane.in_flight = lane.queue.popleft()
                if lane.in_flight is not None:
                    lane.exporting = True
                    return lane.in_flight[1]
                if self._closing:  # drained: shutdown sealed the last open batch already
                    lane.finished = True
                    self._progress.notify_all()
                    return None
                self._wait_for_work(lane)

    def _wait_for_work(self, lane: _Lane) -> None:
        if self._open_deadline is None:
            lane.wake.wait()
            return
        remaining = self._open_deadline - time.monotonic()
        if remaining <= 0:
            self._seal_open_batch()
        else:
            lane.wake.wait(remaining)

    @staticmethod
    def _export(lane: _Lane, batch: SpanBatch) -> bool:
        try:
            return lane.sink.export(batch) is True
        except Exception:  # noqa: BLE001 - sinks must not raise; if one does, it is a failed attempt
            if not lane.raised_before:
                lane.raised_before = True
                _log.exception("sink %s raised from export; retrying as a failed attempt (logged once)", lane.sink.name)
            return False

    def _record_outcome(self, lane: _Lane, batch: SpanBatch, delivered: bool) -> bool:
        """Account for one export attempt; True when it should be retried after a backoff."""
        lane.exporting = False
        evicted, lane.evicted_while_exporting = lane.evicted_while_exporting, 0
        if lane.finished or lane.in_flight is None:  # abandoned by shutdown meanwhile: already counted
            return False
        name = lane.sink.name
        if delivered:
            self._counters.add(SPANS, len(batch), label=name)
            lane.queued_spans -= len(batch) - evicted
            lane.in_flight = None
            lane.backoff_s = self._initial_backoff_s
            self._progress.notify_all()
            return False
        self._counters.add(FAILURES, 1, label=name)
        if evicted:
            self._counters.add(DROPPED, evicted, label=name)
            sequence = lane.in_flight[0]
            lane.in_flight = (sequence, batch.without_oldest(evicted)) if evicted < len(batch) else None
            self._progress.notify_all()
        return True

    def _back_off(self, lane: _Lane) -> None:
        with self._lock:
            until = time.monotonic() + lane.backoff_s * random.uniform(1 - _JITTER, 1 + _JITTER)
            lane.backoff_s = min(lane.backoff_s * 2, self._max_backoff_s)
            while not lane.hurry and not lane.finished:
                remaining = min(until, self._shutdown_deadline) - time.monotonic()
                if remaining <= 0:
                    break
                lane.wake.wait(remaining)
            lane.hurry = False

    def _abandon(self, lane: _Lane) -> None:
        """Stop a lane at the shutdown deadline, counting everything it still holds as dropped."""
        lost = lane.queued_spans + lane.evicted_while_exporting
        self._counters.add(DROPPED, lost, label=lane.sink.name)
        if lost:
            _log.warning("sink %s: %d spans not delivered before the shutdown timeout", lane.sink.name, lost)
        lane.queue.clear()
        lane.in_flight = None
        lane.queued_spans = lane.evicted_while_exporting = 0
        lane.finished = True
        lane.wake.notify_all()
        self._progress.notify_all()

    # --- flush and shutdown -----------------------------------------------------

    def force_flush(self, timeout_s: float = 5.0) -> bool:
        """Deliver everything queued so far; False if the timeout expired first."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._seal_open_batch()
            last_sealed = self._next_sequence - 1
            self._hurry_all_lanes()
            done = self._wait_until_resolved(last_sealed, deadline)
        for lane in self._lanes:
            _flush_sink(lane.sink)
        return done

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Deliver what is queued within ``timeout_s``, count the rest as dropped, stop the sinks."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._shutdown_deadline = time.monotonic() + timeout_s
            self._seal_open_batch()
            self._hurry_all_lanes()
        for lane in self._lanes:
            assert lane.thread is not None
            lane.thread.join(max(0.0, self._shutdown_deadline - time.monotonic()))
        with self._lock:
            for lane in self._lanes:
                if not lane.finished:  # still inside an export at the deadline
                    self._abandon(lane)
        for lane in self._lanes:
            _shutdown_sink(lane.sink)

    def _hurry_all_lanes(self) -> None:
        for lane in self._lanes:
            lane.hurry = True
            lane.wake.notify()

    def _wait_until_resolved(self, last_sequence: int, deadline: float) -> bool:
        while any(not lane.finished and lane.oldest_sequence() <= last_sequence for lane in self._lanes):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._progress.wait(remaining)
        return True

    def _count_for_every_sink(self, name: str, amount: int) -> None:
        for lane in self._lanes:
            self._counters.add(name, amount, label=lane.sink.name)


def _is_exportable(span: SpanRecord) -> bool:
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


def _flush_sink(sink: SpanSink) -> None:
    try:
        sink.flush()
    except Exception:  # noqa: BLE001
        _log.exception("sink %s raised from flush", sink.name)


def _shutdown_sink(sink: SpanSink) -> None:
    try:
        sink.shutdown()
    except Exception:  # noqa: BLE001
        _log.exception("sink %s raised from shutdown", sink.name)


def _setting(name: str, explicit: float | None, env_name: str, default: float, env_unit: float = 1.0) -> float:
    """The explicit value if given (must be positive), else the environment's (times ``env_unit``), else ``default``."""
    if explicit is None:
        from_env = _env_number(env_name)
        return default if from_env is None else from_env * env_unit
    if not explicit > 0:
        raise ValueError(f"{name} must be positive, got {explicit!r}")
    return explicit


def _env_number(name: str) -> float | None:
    """A positive number from the environment; None if unset or malformed (with a warning)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
        if value > 0 and math.isfinite(value):
            return value
    except ValueError:
        pass
    _log.warning("ignoring %s=%r: not a positive number", name, raw)
    return None
