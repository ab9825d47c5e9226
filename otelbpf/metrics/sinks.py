"""Where metric requests go: OTLP (gRPC, HTTP/protobuf) through the official
metric exporters, and an OTLP/JSON lines file.

A metric sink takes one prebuilt ``ExportMetricsServiceRequest`` and answers
True (delivered) or False (failed); it never raises. There is no retry queue
above it: temporality is cumulative, so the next export carries everything
a failed one had.

The OTLP adapters are the metric twins of the span adapters in
``otelbpf.export.otlp`` and reuse its sink class (failure logging once per
outage, idempotent shutdown that interrupts an export in progress) and its
filter on the official exporters' per-retry log lines:

* gRPC: the official ``OTLPMetricExporter.export()`` hands its input to
  ``OTLPExporterMixin._export()``, which calls the abstract hooks
  ``_translate_data`` (make the request) and ``_count_data``. The adapter
  implements them for a prebuilt request (pass-through, count data points),
  so the mixin's retrying send path, channel, TLS, headers, compression and
  OTEL_EXPORTER_OTLP_METRICS_* / OTEL_EXPORTER_OTLP_* handling apply as is.
* HTTP: the official exporter encodes the SDK's MetricsData and passes the
  ``ExportMetricsServiceRequest`` to ``_export_batch(request)`` (request-size
  guard, the exporter's own metrics, ``_OTLPHTTPClient``: compression, POST,
  retries). The adapter calls ``_export_batch`` with ours. It is private, so
  the constructor checks that it is still there and fails loudly otherwise.
  Verified against 1.45.2; tests/test_metrics.py exercises both adapters end
  to end against a real receiver.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Mapping, Protocol, runtime_checkable
from urllib.parse import urlsplit

from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.grpc import metric_exporter as grpc_metric_exporter
from opentelemetry.exporter.otlp.proto.http import metric_exporter as http_metric_exporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.metrics.export import MetricExportResult

from otelbpf.export.jsonfile import JsonFileSink
from otelbpf.export.otlp import GRPC, RECONNECT_OPTIONS, _library_log_filter, _OtlpSink, resolve_protocol

#: The HTTP metric exporter's own logger (the gRPC mixin's and the HTTP client's are filtered by otelbpf.export.otlp).
logging.getLogger(http_metric_exporter.__name__).addFilter(_library_log_filter)

_GO_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


@runtime_checkable
class MetricSink(Protocol):
    """A destination for metric requests."""

    #: Label for this sink's ``otelbpf.metrics.export*`` counters.
    name: str

    def export(self, request: ExportMetricsServiceRequest) -> bool:
        """Deliver ``request``: True when delivered, False otherwise. Never raises."""
        ...

    def shutdown(self) -> None:
        """Release resources; interrupts an export in progress where the transport allows. Idempotent."""
        ...


def make_otlp_metric_sink(
    endpoint: str | None = None, protocol: str | None = None, *, timeout_s: float | None = None
) -> OtlpGrpcMetricSink | OtlpHttpMetricSink:
    """The OTLP metric sink for ``protocol`` (else OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
    OTEL_EXPORTER_OTLP_PROTOCOL, else grpc).

    ``endpoint`` overrides the OTEL_EXPORTER_OTLP_METRICS_ENDPOINT /
    OTEL_EXPORTER_OTLP_ENDPOINT variables. For http/protobuf both a base URL
    (``http://host:4318``, gets ``/v1/metrics``) and the full
    ``.../v1/metrics`` URL are accepted; a ``.../v1/traces`` URL (the same
    ``--otlp-endpoint`` given for spans) has its path replaced. For grpc an
    ``http://`` endpoint means plaintext, ``https://`` or no scheme TLS
    (unless OTEL_EXPORTER_OTLP_METRICS_INSECURE / _INSECURE=true).
    """
    if resolve_metrics_protocol(protocol) == GRPC:
        return OtlpGrpcMetricSink(endpoint, timeout_s=timeout_s)
    return OtlpHttpMetricSink(endpoint, timeout_s=timeout_s)


def resolve_metrics_protocol(protocol: str | None = None) -> str:
    """``protocol``, else OTEL_EXPORTER_OTLP_METRICS_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL, else grpc."""
    return resolve_protocol(protocol, signal="METRICS")


def metrics_url(endpoint: str) -> str:
    """The OTLP/HTTP metrics URL for a base URL, a ``.../v1/metrics`` URL or a ``.../v1/traces`` URL."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"OTLP/HTTP endpoint must be an http:// or https:// URL, got {endpoint!r}")
    path = parts.path.rstrip("/")
    if path.endswith("/v1/metrics"):
        return endpoint
    if path.endswith("/v1/traces"):
        return parts._replace(path=path[: -len("/v1/traces")] + "/v1/metrics").geturl()
    return endpoint.rstrip("/") + "/v1/metrics"


class _OtlpMetricSink(_OtlpSink):
    """The span sink's failure logging and shutdown, exporting a metrics request."""

    def export(self, request: ExportMetricsServiceRequest) -> bool:  # type: ignore[override]
        return self.export_request(request)


class OtlpGrpcMetricSink(_OtlpMetricSink):
    """Exports to an OTLP/gRPC endpoint through the official gRPC metric exporter."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        insecure: bool | None = None,
        name: str = "otlp-metrics",
    ) -> None:
        exporter = _RequestGrpcMetricExporter(
            endpoint=endpoint,
            headers=dict(headers) if headers else None,
            timeout=timeout_s,
            insecure=insecure,
            channel_options=RECONNECT_OPTIONS,
        )
        super().__init__(exporter, name)  # type: ignore[arg-type]


class OtlpHttpMetricSink(_OtlpMetricSink):
    """Exports to an OTLP/HTTP (protobuf) endpoint through the official HTTP metric exporter."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        name: str = "otlp-metrics",
    ) -> None:
        url = metrics_url(endpoint) if endpoint else None
        exporter = _RequestHttpMetricExporter(endpoint=url, headers=headers, timeout=timeout_s)
        super().__init__(exporter, name)  # type: ignore[arg-type]


# --- the adapters: the only code that touches the exporters' internals -------


class _RequestGrpcMetricExporter(grpc_metric_exporter.OTLPMetricExporter):
    """The official gRPC metric exporter, fed a prebuilt ExportMetricsServiceRequest."""

    def _translate_data(  # type: ignore[override]
        self, data: ExportMetricsServiceRequest
    ) -> ExportMetricsServiceRequest:
        if not isinstance(data, ExportMetricsServiceRequest):
            raise TypeError(f"expected ExportMetricsServiceRequest, got {type(data).__name__}")
        return data

    def _count_data(self, data: ExportMetricsServiceRequest) -> int:  # type: ignore[override]
        return count_data_points(data)

    @property
    def target(self) -> str:
        return str(self._endpoint)

    def export_request(self, request: ExportMetricsServiceRequest) -> bool:
        # export() -> OTLPExporterMixin._export() -> our _translate_data(): the retrying send path.
        return self.export(request) is MetricExportResult.SUCCESS  # type: ignore[arg-type]


class _RequestHttpMetricExporter(http_metric_exporter.OTLPMetricExporter):
    """The official HTTP metric exporter, fed a prebuilt ExportMetricsServiceRequest."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        if not callable(getattr(self, "_export_batch", None)):
            raise RuntimeError(
                "opentelemetry-exporter-otlp-proto-http no longer has OTLPMetricExporter._export_batch(request); "
                "otelbpf.metrics.sinks._RequestHttpMetricExporter must be adapted to this version"
            )

    @property
    def target(self) -> str:
        return str(self._endpoint)

    def export_request(self, request: ExportMetricsServiceRequest) -> bool:
        if self._shutdown:
            return False
        return self._export_batch(request) is MetricExportResult.SUCCESS


def count_data_points(request: ExportMetricsServiceRequest) -> int:
    count = 0
    for resource_metrics in request.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                which = metric.WhichOneof("data")
                if which:
                    count += len(getattr(metric, which).data_points)
    return count


# --- OTLP/JSON lines -------------------------------------------------------------


class MetricsJsonFileSink(JsonFileSink):
    """Appends one OTLP/JSON line per ExportMetricsServiceRequest to ``path``.

    The encoding is the Collector file exporter's (and ``otlpjsonfile``
    receiver's): lowerCamelCase keys, 64-bit integers (times, counts,
    ``asInt``) as strings, enums (``aggregationTemporality``) as integers,
    default values omitted. Metrics have no trace/span ids, so
    ``google.protobuf.json_format`` writes exactly that. Opening, appending
    whole lines, cutting a half-written line after a failed write and
    closing are the span JSON sink's.
    """

    def __init__(self, path: str | Path, *, name: str = "jsonfile-metrics") -> None:
        super().__init__(path, name=name)

    def export(self, request: ExportMetricsServiceRequest) -> bool:  # type: ignore[override]
        return self._write(lambda: (metrics_to_otlp_json(request) + "\n").encode("utf-8"))


def metrics_json_path(traces_path: str | Path) -> Path:
    """A sibling of a span JSON file for metrics: ``traces.json`` -> ``traces.metrics.json``."""
    path = Path(traces_path)
    suffix = path.suffix or ".json"
    return path.with_name(f"{path.stem if path.suffix else path.name}.metrics{suffix}")


def metrics_to_otlp_json(request: ExportMetricsServiceRequest) -> str:
    """One line of OTLP/JSON (no trailing newline)."""
    document = json_format.MessageToDict(request, use_integers_for_enums=True)
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).translate(_GO_ESCAPES)


def metrics_from_otlp_json(line: str) -> ExportMetricsServiceRequest:
    return json_format.Parse(line, ExportMetricsServiceRequest())


def read_metrics_json_file(path: str | Path) -> list[ExportMetricsServiceRequest]:
    """All complete lines of a metrics OTLP/JSON file (a last line without newline is skipped)."""
    requests: list[ExportMetricsServiceRequest] = []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if not line.endswith("\n") or not line.strip():
                continue
            try:
                requests.append(metrics_from_otlp_json(line))
            except (ValueError, json_format.ParseError) as exc:
                raise ValueError(f"{path}:{number}: not an OTLP/JSON metrics request: {exc}") from exc
    return requests
