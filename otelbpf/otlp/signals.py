"""The OTLP signals otelbpf sends, and what differs between them on the wire.

A :class:`Signal` is everything the transports need to know about one
signal: its OTLP/HTTP path (``/v1/traces``), its gRPC method, the infix of
its OTEL_EXPORTER_OTLP_{INFIX}_* variables, its request and response
messages, how to count the items of a request (for the official exporters'
own metrics), and the name its sink gets by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
    ExportProfilesServiceRequest,
    ExportProfilesServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def count_spans(request: ExportTraceServiceRequest) -> int:
    return sum(len(scope.spans) for resource in request.resource_spans for scope in resource.scope_spans)


def count_data_points(request: ExportMetricsServiceRequest) -> int:
    count = 0
    for resource_metrics in request.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                which = metric.WhichOneof("data")
                if which:
                    count += len(getattr(metric, which).data_points)
    return count


def count_profiles(request: ExportProfilesServiceRequest) -> int:
    return sum(len(scope.profiles) for resource in request.resource_profiles for scope in resource.scope_profiles)


@dataclass(frozen=True, slots=True)
class Signal:
    """One OTLP signal: traces, metrics or profiles."""

    #: Lower-case name: ``traces``, ``metrics``, ``profiles``.
    name: str
    #: The OTEL_EXPORTER_OTLP_{env}_* variables' infix: ``TRACES``, ``METRICS``, ``PROFILES``.
    env: str
    #: OTLP/HTTP path appended to a base endpoint.
    http_path: str
    #: Full gRPC method name of the collector's Export call.
    grpc_method: str
    #: The Export request and response messages.
    request_type: type
    response_type: type
    #: Items in a request message (spans, data points, profiles).
    count: Callable[[Any], int]
    #: Default name of this signal's OTLP sink (the ``sink`` label of the export counters).
    sink_name: str


TRACES = Signal(
    name="traces",
    env="TRACES",
    http_path="/v1/traces",
    grpc_method="/opentelemetry.proto.collector.trace.v1.TraceService/Export",
    request_type=ExportTraceServiceRequest,
    response_type=ExportTraceServiceResponse,
    count=count_spans,
    sink_name="otlp",
)
METRICS = Signal(
    name="metrics",
    env="METRICS",
    http_path="/v1/metrics",
    grpc_method="/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
    request_type=ExportMetricsServiceRequest,
    response_type=ExportMetricsServiceResponse,
    count=count_data_points,
    sink_name="otlp-metrics",
)
#: Profiles are still "development" in OTLP; the path and method are the Collector's for v1development.
PROFILES = Signal(
    name="profiles",
    env="PROFILES",
    http_path="/v1development/profiles",
    grpc_method="/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export",
    request_type=ExportProfilesServiceRequest,
    response_type=ExportProfilesServiceResponse,
    count=count_profiles,
    sink_name="otlp-profiles",
)

SIGNALS: tuple[Signal, ...] = (TRACES, METRICS, PROFILES)
