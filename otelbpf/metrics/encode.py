"""Collected metrics straight into OTLP ``ExportMetricsServiceRequest`` protobufs.

Layout: one ``ResourceMetrics`` per traced process (its Resource from the
ResourceLookup, as for its spans) holding one histogram per instrument that
recorded something (name, unit, description and bucket boundaries from the
instrument's definition, ``otelbpf.metrics.instruments.SpanHistogram``), and
one for the agent itself
holding its counters (monotonic Sums) and gauges. Every ``ScopeMetrics`` is
scope ``otelbpf``, versioned with the agent. Temporality is cumulative.

Large collections are split so that no request holds more than
``max_points`` data points (the Collector's gRPC receiver refuses messages
over 4 MiB by default; a histogram point with its bounds and attributes is ~500 bytes): a
split repeats the Resource, scope and metric headers, as the official
exporters' ``max_export_batch_size`` splitting does.

Attribute values are written by the shared attribute writers
(``otelbpf.otlp.wire``), including their careful path for odd values.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

import otelbpf
from otelbpf.core.model import AttributeValue
from otelbpf.metrics.selfmetrics import AgentMetrics
from otelbpf.metrics.histograms import HistogramPoint, ProcessHistograms
from otelbpf.otlp.wire import fill_attributes_checked, fill_attributes_safely

SCOPE_NAME = "otelbpf"
CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
#: Data points per request at most (~500 bytes each for a histogram: ~1 MB, well under gRPC's 4 MiB).
DEFAULT_MAX_POINTS = 2000

_HISTOGRAM, _SUM, _GAUGE = "histogram", "sum", "gauge"


def encode_metrics(
    processes: Sequence[ProcessHistograms],
    agent: AgentMetrics | None,
    time_ns: int,
    max_points: int = DEFAULT_MAX_POINTS,
    start_ns: int = 0,
) -> list[ExportMetricsServiceRequest]:
    """The requests for one collection: processes first, then the agent. Empty list if there is nothing.
    ``start_ns``: the start time of the processes' Sums (when the agent began counting)."""
    builder = _Builder(max_points)
    for process in processes:
        builder.resource(process.resource)
        for instrument, points in process.histograms:
            builder.metric(instrument.name, instrument.description, instrument.unit, _HISTOGRAM)
            for point in points:
                _fill_histogram_point(builder.point(), point, instrument.boundaries, time_ns)
        for name, description, unit, value in process.gauges:
            builder.metric(name, description, unit, _GAUGE)
            out = builder.point()
            out.time_unix_nano = time_ns
            if isinstance(value, int):
                out.as_int = value
            else:
                out.as_double = value
        for name, description, unit, value in process.sums:
            builder.metric(name, description, unit, _SUM)
            out = builder.point()
            out.start_time_unix_nano = start_ns
            out.time_unix_nano = time_ns
            if isinstance(value, int):
                out.as_int = value
            else:
                out.as_double = value
    if agent is not None:
        builder.resource(agent.resource)
        for total in agent.sums:
            if not total.points:
                continue
            builder.metric(total.name, total.description, total.unit, _SUM)
            for attributes, value in total.points:
                out = builder.point()
                fill_attributes_checked(out.attributes, attributes)
                out.start_time_unix_nano = agent.start_ns
                out.time_unix_nano = time_ns
                out.as_int = value
        for gauge_points in agent.gauge_points:
            if not gauge_points.points:
                continue
            builder.metric(gauge_points.name, gauge_points.description, gauge_points.unit, _GAUGE)
            for attributes, value in gauge_points.points:
                out = builder.point()
                fill_attributes_checked(out.attributes, attributes)
                out.time_unix_nano = time_ns
                if isinstance(value, int):
                    out.as_int = value
                else:
                    out.as_double = value
        for gauge in agent.gauges:
            builder.metric(gauge.name, gauge.description, gauge.unit, _GAUGE)
            out = builder.point()
            out.time_unix_nano = time_ns
            if isinstance(gauge.value, int):
                out.as_int = gauge.value
            else:
                out.as_double = gauge.value
    return builder.requests


def _fill_histogram_point(out: Any, point: HistogramPoint, boundaries: Sequence[float], time_ns: int) -> None:
    fill_attributes_checked(out.attributes, point.attributes)
    out.start_time_unix_nano = point.start_ns
    out.time_unix_nano = time_ns
    out.count = point.count
    out.sum = point.sum
    out.min = point.min
    out.max = point.max
    out.bucket_counts.extend(point.bucket_counts)
    out.explicit_bounds.extend(boundaries)


class _Builder:
    """Appends data points, opening a new request every ``max_points`` points and
    (re)writing the Resource / scope / metric headers only where points go."""

    def __init__(self, max_points: int) -> None:
        if max_points < 1:
            raise ValueError(f"max_points must be >= 1, got {max_points!r}")
        self.requests: list[ExportMetricsServiceRequest] = []
        self._max_points = max_points
        self._points_in_request = max_points  # the first point opens a request
        self._resource: Mapping[str, AttributeValue] = {}
        self._metric: tuple[str, str, str, str] = ("", "", "", _GAUGE)
        self._scope_metrics: Any = None
        self._data_points: Any = None

    def resource(self, attributes: Mapping[str, AttributeValue]) -> None:
        self._resource = attributes
        self._scope_metrics = self._data_points = None

    def metric(self, name: str, description: str, unit: str, kind: str) -> None:
        self._metric = (name, description, unit, kind)
        self._data_points = None

    def point(self) -> Any:
        if self._points_in_request >= self._max_points:
            self.requests.append(ExportMetricsServiceRequest())
            self._points_in_request = 0
            self._scope_metrics = self._data_points = None
        if self._scope_metrics is None:
            resource_metrics = self.requests[-1].resource_metrics.add()
            fill_attributes_safely(resource_metrics.resource.attributes, self._resource)
            self._scope_metrics = resource_metrics.scope_metrics.add()
            self._scope_metrics.scope.name = SCOPE_NAME
            self._scope_metrics.scope.version = otelbpf.__version__
        if self._data_points is None:
            name, description, unit, kind = self._metric
            metric = self._scope_metrics.metrics.add(name=name, description=description, unit=unit)
            if kind == _HISTOGRAM:
                metric.histogram.aggregation_temporality = CUMULATIVE
                self._data_points = metric.histogram.data_points
            elif kind == _SUM:
                metric.sum.aggregation_temporality = CUMULATIVE
                metric.sum.is_monotonic = True
                self._data_points = metric.sum.data_points
            else:
                self._data_points = metric.gauge.data_points
        self._points_in_request += 1
        return self._data_points.add()
