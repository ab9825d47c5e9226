"""OTLP metrics: HTTP request-duration histograms per traced process, and the agent's self-metrics.

Typical wiring (see otelbpf/cli.py)::

    processor = BatchSpanProcessor(sinks, resources, counters)
    http_metrics = HttpMetrics(resources)
    exporter = MetricsExporter(
        http_metrics, counters, agent_resource_attributes(),
        [make_otlp_metric_sink(args.otlp_endpoint, args.otlp_protocol)],
        interval_s=args.metrics_interval,         # None: OTEL_METRIC_EXPORT_INTERVAL (ms), else 60 s
    )
    consumer = MeteredProcessor(processor, http_metrics, exporter)   # on_end: span + its metrics
    pipeline = Pipeline(consumer, resources, counters, privacy)
    exporter.add_gauge("otelbpf.connections.open", lambda: len(pipeline.table))
    agent = Agent(source, pipeline, consumer, counters)              # shutdown: spans, then metrics
"""

from otelbpf.metrics.agent import agent_resource_attributes, label_key
from otelbpf.metrics.consumer import MeteredProcessor
from otelbpf.metrics.encode import encode_metrics
from otelbpf.metrics.exporter import MetricsExporter, resolve_interval
from otelbpf.metrics.http import (
    CLIENT_ATTRIBUTES,
    CLIENT_DURATION,
    DURATION_BOUNDARIES,
    OVERFLOW_ATTRIBUTE,
    SERVER_ATTRIBUTES,
    SERVER_DURATION,
    HttpMetrics,
)
from otelbpf.metrics.sinks import (
    MetricSink,
    MetricsJsonFileSink,
    OtlpGrpcMetricSink,
    OtlpHttpMetricSink,
    make_otlp_metric_sink,
    metrics_json_path,
    read_metrics_json_file,
    resolve_metrics_protocol,
)

__all__ = [
    "CLIENT_ATTRIBUTES",
    "CLIENT_DURATION",
    "DURATION_BOUNDARIES",
    "OVERFLOW_ATTRIBUTE",
    "SERVER_ATTRIBUTES",
    "SERVER_DURATION",
    "HttpMetrics",
    "MeteredProcessor",
    "MetricSink",
    "MetricsExporter",
    "MetricsJsonFileSink",
    "OtlpGrpcMetricSink",
    "OtlpHttpMetricSink",
    "agent_resource_attributes",
    "encode_metrics",
    "label_key",
    "make_otlp_metric_sink",
    "metrics_json_path",
    "read_metrics_json_file",
    "resolve_interval",
    "resolve_metrics_protocol",
]
