"""OTLP metrics: histograms of finished spans per traced process, and the agent's self-metrics.

What is measured is data: each protocol's instruments
(``otelbpf.metrics.instruments.SpanHistogram``, e.g. ``otelbpf.metrics.http1``).
Typical wiring (see otelbpf/cli/main.py)::

    processor = BatchSpanProcessor(sinks, resources, counters)
    span_metrics = SpanMetrics(resources, default_instruments())
    exporter = MetricsExporter(
        span_metrics, counters, agent_resource_attributes(),
        [make_otlp_metric_sink(args.otlp_endpoint, args.otlp_protocol)],
        interval_s=args.metrics_interval,         # None: OTEL_METRIC_EXPORT_INTERVAL (ms), else 60 s
    )
    consumer = MeteredProcessor(processor, span_metrics, exporter)   # on_end: span + its metrics
    pipeline = Pipeline(consumer, resources, counters, privacy)
    exporter.add_gauge("otelbpf.connections.open", lambda: len(pipeline.table))
    agent = Agent(source, pipeline, consumer, counters)              # shutdown: spans, then metrics
"""

from otelbpf.metrics.selfmetrics import agent_resource_attributes, label_key
from otelbpf.metrics.consumer import MeteredProcessor
from otelbpf.metrics.encode import encode_metrics
from otelbpf.metrics.exporter import MetricsExporter, resolve_interval
from otelbpf.metrics.histograms import (
    OVERFLOW_ATTRIBUTE,
    HistogramPoint,
    ProcessHistograms,
    SpanMetrics,
    SpanMetricsCollection,
)
from otelbpf.metrics.instruments import SpanHistogram
from otelbpf.metrics.sinks import (
    MetricSink,
    MetricsJsonFileSink,
    make_otlp_metric_sink,
    metrics_json_path,
    read_metrics_json_file,
)

__all__ = [
    "OVERFLOW_ATTRIBUTE",
    "HistogramPoint",
    "MeteredProcessor",
    "MetricSink",
    "MetricsExporter",
    "MetricsJsonFileSink",
    "ProcessHistograms",
    "SpanHistogram",
    "SpanMetrics",
    "SpanMetricsCollection",
    "agent_resource_attributes",
    "encode_metrics",
    "label_key",
    "make_otlp_metric_sink",
    "metrics_json_path",
    "read_metrics_json_file",
    "resolve_interval",
]
