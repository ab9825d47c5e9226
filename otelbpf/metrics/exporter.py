"""Exports the collected metrics on an interval, from a background thread.

* Every ``interval_s`` (argument, else OTEL_METRIC_EXPORT_INTERVAL in
  milliseconds, else 60 s as in the SDK) the timer thread collects: the span
  histograms, the agent's counters and gauges, all cumulative. It encodes
  them once (:func:`otelbpf.metrics.encode.encode_metrics`) and hands the
  requests to every sink.
* Each sink has its own worker thread and a one-slot mailbox. A sink still
  busy with an older collection (a collector that is slow or down) gets the
  newer one in its place when it is done: with cumulative temporality the
  newest collection carries everything the older one had, so nothing is
  queued and nothing is retried here (the OTLP sinks retry transient errors
  within their own timeout). Each request delivered counts
  ``otelbpf.metrics.exports{sink}``, each failed one
  ``otelbpf.metrics.export.failures{sink}``.
* ``shutdown(timeout_s)`` stops the timer, collects one last time, gives the
  sinks until the deadline to deliver it, then shuts the sinks down (which
  interrupts an export in progress) and returns: it never waits past the
  timeout for a sink, and a collection still undelivered then is counted as
  failed.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otelbpf.core.model import AttributeValue
from otelbpf.core.selfmetrics import Counters
from otelbpf.metrics.selfmetrics import (
    EXPORT_FAILURES,
    EXPORTS,
    SERIES,
    AgentMetrics,
    GaugeReader,
    SumMetric,
    agent_resource_attributes,
    counter_sums,
)
from otelbpf.metrics.encode import DEFAULT_MAX_POINTS, encode_metrics
from otelbpf.metrics.histograms import EXPIRED, OVERFLOWED, ProcessHistograms, SpanMetrics
from otelbpf.metrics.sinks import MetricSink

_log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 60.0
INTERVAL_ENV = "OTEL_METRIC_EXPORT_INTERVAL"
TEMPORALITY_ENV = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"


def resolve_interval(interval_s: float | None = None) -> float:
    """``interval_s`` (must be positive), else OTEL_METRIC_EXPORT_INTERVAL (ms), else 60 s."""
    if interval_s is not None:
        if not (interval_s > 0 and math.isfinite(interval_s)):
            raise ValueError(f"interval_s must be positive, got {interval_s!r}")
        return float(interval_s)
    raw = os.environ.get(INTERVAL_ENV, "").strip()
    if raw:
        try:
            value = float(raw)
            if value > 0 and math.isfinite(value):
                return value / 1000.0
        except ValueError:
            pass
        _log.warning("ignoring %s=%r: not a positive number of milliseconds", INTERVAL_ENV, raw)
    return DEFAULT_INTERVAL_S


@dataclass(eq=False)
class _Lane:
    """One sink's mailbox and worker. Fields are guarded by the exporter's lock."""

    sink: MetricSink
    wake: threading.Condition
    #: The newest collection not yet taken by the worker.
    pending: list[ExportMetricsServiceRequest] | None = None
    busy: bool = False
    #: Collections handed to this lane so far, and resolved (delivered, failed or superseded) so far.
    handed: int = 0
    resolved: int = 0
    finished: bool = False
    thread: threading.Thread | None = field(default=None, repr=False)


class MetricsExporter:
    """Collects the span metrics and the agent's self-metrics, exports them to ``sinks`` on an interval."""

    def __init__(
        self,
        span_metrics: SpanMetrics | None,
        counters: Counters,
        agent_resource: Mapping[str, AttributeValue] | None,
        sinks: Sequence[MetricSink],
        interval_s: float | None = None,
        *,
        gauges: Mapping[str, Callable[[], int | float]] | None = None,
        max_points_per_request: int = DEFAULT_MAX_POINTS,
        start: bool = True,
    ) -> None:
        self._span_metrics = span_metrics
        self._counters = counters
        self._agent_resource = dict(agent_resource) if agent_resource is not None else agent_resource_attributes()
        self.interval_s = resolve_interval(interval_s)
        all_gauges = dict(gauges or {})
        if span_metrics is not None:
            all_gauges.setdefault(SERIES, lambda: span_metrics.series_count)
        self._gauges = GaugeReader(all_gauges)
        self._process_gauges: list[tuple[Callable, Callable]] = []
        self._process_sums: list[tuple[Callable, Callable]] = []
        self._agent_points: list[Callable] = []
        self._max_points = max_points_per_request
        self._start_ns = time.time_ns()
        preference = os.environ.get(TEMPORALITY_ENV, "").strip().lower()
        if preference and preference != "cumulative":
            _log.warning(
                "%s=%s ignored: otelbpf exports cumulative metrics (a Collector's cumulativetodelta processor "
                "converts them)",
                TEMPORALITY_ENV,
                preference,
            )

        self._lock = threading.Lock()
        self._tick = threading.Condition(self._lock)
        self._progress = threading.Condition(self._lock)
        self._collect_lock = threading.Lock()  # one collection at a time (timer, flush, shutdown)
        self._closing = False
        self._shutdown_started = False
        self._lanes = [_Lane(sink, threading.Condition(self._lock)) for sink in sinks]
        self._timer: threading.Thread | None = None
        if start:
            self.start()

    def start(self) -> None:
        """Start the timer and sink threads (done by the constructor unless ``start=False``;
        ``export_now``, ``force_flush`` and ``shutdown`` start them too). Idempotent."""
        with self._lock:
            if self._timer is not None or self._shutdown_started:
                return
            self._timer = threading.Thread(target=self._run_timer, name="otelbpf-metrics-timer")
        for lane in self._lanes:
            name = f"otelbpf-metrics-{lane.sink.name}"
            lane.thread = threading.Thread(target=self._run_lane, args=(lane,), name=name)
            lane.thread.daemon = True
            lane.thread.start()
        self._timer.daemon = True
        self._timer.start()

    def add_gauge(self, name: str, read: Callable[[], int | float]) -> None:
        """Export ``read()`` as gauge ``name`` from the next collection on (e.g. once the pipeline exists)."""
        self._gauges.add(name, read)

    def add_process_gauges(
        self,
        read: Callable[[], Mapping[int, list[tuple[str, str, str, int | float]]]],
        resource_of: Callable[[int], Mapping[str, AttributeValue]],
    ) -> None:
        """Export per-process gauges from the next collection on: ``read()`` gives
        pid -> [(name, description, unit, value)] (e.g. GPU memory reserved),
        each under the process's Resource (``resource_of(pid)``)."""
        self._process_gauges.append((read, resource_of))

    def add_process_sums(
        self,
        read: Callable[[], Mapping[int, list[tuple[str, str, str, int | float]]]],
        resource_of: Callable[[int], Mapping[str, AttributeValue]],
    ) -> None:
        """Like :meth:`add_process_gauges`, for cumulative monotonic Sums counted since the
        agent started (e.g. GPU kernel launches read from the kernel's per-process totals)."""
        self._process_sums.append((read, resource_of))

    def add_agent_points(self, read: Callable[[], Sequence[tuple[str, str, str, str, list]]]) -> None:
        """Export, under the agent's Resource, what ``read()`` gives at each collection:
        (name, description, unit, kind ``"gauge"`` or ``"sum"`` (cumulative, monotonic),
        [(attributes, value)]) (e.g. NCCL's RAS view, otelbpf/sources/nccl_ras.py)."""
        self._agent_points.append(read)

    def _read_agent_points(self) -> tuple[list[SumMetric], list[SumMetric]]:
        sums: list[SumMetric] = []
        gauges: list[SumMetric] = []
        for read in self._agent_points:
            try:
                metrics = read()
            except Exception:  # noqa: BLE001 - a reader's bug never breaks the export
                _log.exception("metrics: reading agent points failed")
                continue
            for name, description, unit, kind, points in metrics:
                (sums if kind == "sum" else gauges).append(SumMetric(name, description, unit, list(points)))
        return sums, gauges

    # --- collection ---------------------------------------------------------------

    def collect(self) -> list[ExportMetricsServiceRequest]:
        """Collect everything now and encode it (what each export sends). Thread-safe."""
        with self._collect_lock:
            processes: list[ProcessHistograms] = []
            if self._span_metrics is not None:
                collection = self._span_metrics.collect()
                processes = collection.processes
                self._counters.add(OVERFLOWED, collection.overflowed)
                self._counters.add(EXPIRED, collection.expired)
            if self._process_gauges or self._process_sums:
                processes = self._with_process_values(list(processes))
            point_sums, point_gauges = self._read_agent_points()
            agent = AgentMetrics(
                self._agent_resource, self._start_ns, counter_sums(self._counters) + point_sums, self._gauges.read(),
                point_gauges,
            )
            return encode_metrics(processes, agent, time.time_ns(), self._max_points, self._start_ns)

    def _with_process_values(self, processes: list[ProcessHistograms]) -> list[ProcessHistograms]:
        by_pid = {process.pid: process for process in processes}
        for readers, kind in ((self._process_gauges, "gauges"), (self._process_sums, "sums")):
            for read, resource_of in readers:
                for pid, values in read().items():
                    process = by_pid.get(pid)
                    if process is None:
                        process = by_pid[pid] = ProcessHistograms(pid, resource_of(pid))
                        processes.append(process)
                    getattr(process, kind).extend(values)
        return processes

    def export_now(self) -> None:
        """Collect now and hand the result to every sink (asynchronously)."""
        self.start()
        self._hand(self._collect_safely())

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Collect now and wait until every sink resolved it; False if the timeout expired first."""
        deadline = time.monotonic() + timeout_s
        self.start()
        requests = self._collect_safely()
        with self._lock:
            targets = [(lane, self._hand_locked(lane, requests)) for lane in self._lanes]
            return self._wait_resolved(targets, deadline)

    def _collect_safely(self) -> list[ExportMetricsServiceRequest]:
        try:
            return self.collect()
        except Exception:  # noqa: BLE001 - a bug here must not kill the timer or the agent
            _log.exception("metrics collection failed; skipping this export")
            return []

    def _hand(self, requests: list[ExportMetricsServiceRequest]) -> None:
        with self._lock:
            for lane in self._lanes:
                self._hand_locked(lane, requests)

    def _hand_locked(self, lane: _Lane, requests: list[ExportMetricsServiceRequest]) -> int:
        """Put a collection in the lane's mailbox (replacing an untaken older one); its sequence number."""
        if lane.finished:
            return lane.handed
        if lane.pending is not None:
            lane.resolved += 1  # superseded: the newer collection carries its values
        lane.pending = requests
        lane.handed += 1
        lane.wake.notify()
        return lane.handed

    def _wait_resolved(self, targets: list[tuple[_Lane, int]], deadline: float) -> bool:
        while any(not lane.finished and lane.resolved < sequence for lane, sequence in targets):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._progress.wait(remaining)
        return True

    # --- threads --------------------------------------------------------------------

    def _run_timer(self) -> None:
        next_export = time.monotonic() + self.interval_s
        while True:
            with self._lock:
                while not self._closing and time.monotonic() < next_export:
                    self._tick.wait(next_export - time.monotonic())
                if self._closing:
                    return
            self.export_now()
            next_export = max(next_export + self.interval_s, time.monotonic() + self.interval_s / 10)

    def _run_lane(self, lane: _Lane) -> None:
        while True:
            with self._lock:
                while lane.pending is None and not lane.finished:
                    lane.wake.wait()
                if lane.finished:
                    self._progress.notify_all()
                    return
                requests, lane.pending = lane.pending, None
                lane.busy = True
            self._deliver(lane, requests)
            with self._lock:
                lane.busy = False
                lane.resolved += 1
                self._progress.notify_all()

    def _deliver(self, lane: _Lane, requests: list[ExportMetricsServiceRequest]) -> None:
        name = lane.sink.name
        for request in requests:
            try:
                delivered = lane.sink.export(request) is True
            except Exception:  # noqa: BLE001 - sinks must not raise; if one does, it failed
                _log.exception("metric sink %s raised from export", name)
                delivered = False
            with self._lock:
                if lane.finished:  # abandoned at the shutdown deadline: counted there
                    return
                self._counters.add(EXPORTS if delivered else EXPORT_FAILURES, 1, label=name)
            if not delivered:
                return  # the rest of this collection would most likely fail too; the next one carries it

    # --- shutdown ---------------------------------------------------------------------

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Export one last time within ``timeout_s``, then stop the sinks.

        Never raises, never waits past the timeout for a sink."""
        self.start()  # a no-op unless constructed with start=False: the sink threads deliver the final export
        with self._lock:
            if self._shutdown_started:
                return
            self._shutdown_started = True
            self._closing = True  # the timer exits; lanes exit when marked finished below
            self._tick.notify_all()
        deadline = time.monotonic() + timeout_s
        timer = self._timer
        if timer is not None and timer.is_alive():  # wait out a collection in progress
            timer.join(max(0.0, deadline - time.monotonic()))
        requests = self._collect_safely() if time.monotonic() < deadline else []
        with self._lock:
            targets = [(lane, self._hand_locked(lane, requests)) for lane in self._lanes] if requests else []
            self._wait_resolved(targets, deadline)
            for lane in self._lanes:
                if lane.pending is not None or lane.busy:
                    # Not delivered by the deadline: counted once here. An export still in progress is
                    # interrupted by the sink's shutdown below, and its outcome ignored.
                    self._counters.add(EXPORT_FAILURES, 1, label=lane.sink.name)
                lane.pending = None
                lane.finished = True
                lane.wake.notify_all()
        for lane in self._lanes:
            try:
                lane.sink.shutdown()
            except Exception:  # noqa: BLE001
                _log.exception("metric sink %s raised from shutdown", lane.sink.name)
