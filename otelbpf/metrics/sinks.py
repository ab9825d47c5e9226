"""Where metric requests go: the metrics signal on the shared OTLP transports, and an OTLP/JSON lines file.

A metric sink (``MetricSink``) takes one prebuilt ``ExportMetricsServiceRequest``
and answers True (delivered) or False (failed); it never raises. There is no
retry queue above it: temporality is cumulative, so the next export carries
everything a failed one had. The OTLP sinks are ``otelbpf.otlp.transport``'s
for ``METRICS`` (the official metric exporters underneath, so the
OTEL_EXPORTER_OTLP_METRICS_* / OTEL_EXPORTER_OTLP_* variables apply); the
file sink is ``otelbpf.otlp.jsonlines``'s with a metrics line renderer.
"""

from __future__ import annotations

import json
from pathlib import Path

from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otelbpf.otlp.jsonlines import JsonLinesSink, go_escaped, read_json_lines
from otelbpf.otlp.signals import METRICS
from otelbpf.otlp.sink import Sink
from otelbpf.otlp.transport import OtlpSink
from otelbpf.otlp.transport import make_otlp_sink as _make_signal_sink

#: A destination for metric requests.
MetricSink = Sink[ExportMetricsServiceRequest]


def make_otlp_metric_sink(
    endpoint: str | None = None, protocol: str | None = None, *, timeout_s: float | None = None
) -> OtlpSink:
    """The OTLP metric sink for ``protocol`` (else OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
    OTEL_EXPORTER_OTLP_PROTOCOL, else grpc). A ``.../v1/traces`` URL (the same
    ``--otlp-endpoint`` given for spans) has its path replaced; see
    ``otelbpf.otlp.transport.make_otlp_sink``."""
    return _make_signal_sink(METRICS, endpoint, protocol, timeout_s=timeout_s)


class MetricsJsonFileSink(JsonLinesSink[ExportMetricsServiceRequest]):
    """Appends one OTLP/JSON line per ExportMetricsServiceRequest to ``path``.

    The encoding is the Collector file exporter's (and ``otlpjsonfile``
    receiver's): lowerCamelCase keys, 64-bit integers (times, counts,
    ``asInt``) as strings, enums (``aggregationTemporality``) as integers,
    default values omitted. Metrics have no trace/span ids, so
    ``google.protobuf.json_format`` writes exactly that.
    """

    def __init__(self, path: str | Path, *, name: str = "jsonfile-metrics") -> None:
        super().__init__(path, metrics_json_line, name=name)


def metrics_json_path(traces_path: str | Path) -> Path:
    """A sibling of a span JSON file for metrics: ``traces.json`` -> ``traces.metrics.json``."""
    path = Path(traces_path)
    suffix = path.suffix or ".json"
    return path.with_name(f"{path.stem if path.suffix else path.name}.metrics{suffix}")


def metrics_to_otlp_json(request: ExportMetricsServiceRequest) -> str:
    """One line of OTLP/JSON (no trailing newline)."""
    document = json_format.MessageToDict(request, use_integers_for_enums=True)
    return go_escaped(json.dumps(document, ensure_ascii=False, separators=(",", ":")))


def metrics_json_line(request: ExportMetricsServiceRequest) -> bytes:
    return (metrics_to_otlp_json(request) + "\n").encode("utf-8")


def metrics_from_otlp_json(line: str) -> ExportMetricsServiceRequest:
    return json_format.Parse(line, ExportMetricsServiceRequest())


def read_metrics_json_file(path: str | Path) -> list[ExportMetricsServiceRequest]:
    """All complete lines of a metrics OTLP/JSON file (a last line without newline is skipped)."""
    return read_json_lines(path, metrics_from_otlp_json, "metrics request", (ValueError, json_format.ParseError))
