"""OTLP sinks (gRPC and HTTP/protobuf) built on the official exporters.

The official ``opentelemetry-exporter-otlp-proto-{grpc,http}`` span exporters
already implement everything around the wire that is easy to get subtly
wrong: the OTEL_EXPORTER_OTLP_* / OTEL_EXPORTER_OTLP_TRACES_* variables
(endpoint, headers, timeout, compression, insecure, certificates), TLS and
mTLS, gzip, and retries of transient errors (gRPC UNAVAILABLE & co., HTTP
429/502/503/504, with Retry-After / RetryInfo). What they lack is a way in for
a request we encoded ourselves (they expect SDK ``ReadableSpan`` objects, which
are too slow to build per request). The two small adapters below add exactly
that and nothing else. Span batches go out as the bytes ``SpanBatch.payload``
already holds (``SerializedTraces``): parsing them into a message only for
the exporter to serialize it again would cost ~2 us per span each way.

* gRPC: ``OTLPExporterMixin._export`` calls ``self._translate_data(data)`` to
  make the request and ``self._count_data(data)`` for the exporter's own
  metrics; both are abstract hooks of the mixin. The adapter implements them
  (pass-through, count spans) and calls the public ``export()``. The request
  reaches the channel through the mixin's stub, ``self._stub(channel)``
  (``TraceServiceStub``, whose request serializer only takes messages); the
  adapter sets ``_stub`` to ``_TraceServiceStub``, the same method and
  response decoding with a serializer that also passes bytes through, and
  rebuilds ``_client`` from it (the mixin rebuilds it from ``_stub`` when it
  reconnects). Both are private, so the constructor checks that they are
  still there and fails loudly otherwise.
* HTTP: ``OTLPSpanExporter.export`` encodes SDK spans, serializes them and
  hands the bytes to ``self._client.export(data)`` (an ``_OTLPHTTPClient``,
  which compresses, posts and retries). The adapter calls that client with
  our bytes (skipping only the exporter's optional self-metrics and its
  64 MiB request-size guard, far above our batch sizes). ``_client`` is
  private, so the constructor checks that it is still there and fails
  loudly otherwise. Verified against 1.45.2.

tests/test_export_otlp.py exercises both adapters end to end against a real
receiver, so a library upgrade that moves these hooks fails the tests.

Outages are the processor's business (it retries with backoff and keeps
order); these sinks report True/False and log each kind of failure once. The
official exporters log every internal retry; a filter lets each of their
messages through once per outage, so a collector that is down for hours
does not fill the log.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Mapping, NamedTuple
from urllib.parse import urlsplit

import grpc
from opentelemetry.exporter.otlp.proto.grpc import trace_exporter as grpc_trace_exporter
from opentelemetry.exporter.otlp.proto.http import trace_exporter as http_trace_exporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.sdk.trace.export import SpanExportResult

from otelbpf.export.base import FailureLog, SpanBatch, SpanSink

_log = logging.getLogger(__name__)

#: gRPC's own reconnect backoff grows to 120 s after a few failed attempts,
#: so a collector that restarts would be reached minutes late while spans
#: queue up. Cap it: reconnecting is cheap next to a full queue.
RECONNECT_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 5000),
)

GRPC = "grpc"
HTTP_PROTOBUF = "http/protobuf"
PROTOCOLS = (GRPC, HTTP_PROTOBUF)

#: Loggers of the official exporters; they log every internal retry.
_LIBRARY_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.common.http",
)


def make_otlp_sink(
    endpoint: str | None = None, protocol: str | None = None, *, timeout_s: float | None = None
) -> SpanSink:
    """The OTLP sink for ``protocol`` (else the OTEL_EXPORTER_OTLP_*PROTOCOL env vars, else grpc).

    ``endpoint`` overrides the OTEL_EXPORTER_OTLP_*ENDPOINT env vars. For
    http/protobuf both a base URL (``http://host:4318``, gets ``/v1/traces``)
    and the full ``.../v1/traces`` URL are accepted. For grpc an
    ``http://`` endpoint means plaintext, ``https://`` or no scheme means TLS
    (unless OTEL_EXPORTER_OTLP_INSECURE=true), as in the official exporter.
    """
    resolved = resolve_protocol(protocol)
    if resolved == GRPC:
        return OtlpGrpcSink(endpoint, timeout_s=timeout_s)
    return OtlpHttpSink(endpoint, timeout_s=timeout_s)


def resolve_protocol(protocol: str | None = None, signal: str = "TRACES") -> str:
    """``protocol``, else OTEL_EXPORTER_OTLP_{signal}_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL, else grpc."""
    source = "protocol argument"
    if not protocol:
        for variable in (f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
            protocol = os.environ.get(variable, "").strip()
            if protocol:
                source = variable
                break
    value = (protocol or GRPC).strip().lower()
    if value not in PROTOCOLS:
        valid = ", ".join(PROTOCOLS)
        raise ValueError(f"unsupported OTLP protocol {protocol!r} (from {source}); valid values: {valid}")
    return value


class SerializedTraces(NamedTuple):
    """An ``ExportTraceServiceRequest`` already serialized, and how many spans it holds."""

    payload: bytes
    span_count: int


class _OtlpSink(SpanSink):
    """Reports an adapter's outcome as True/False and logs each kind of failure once."""

    def __init__(self, exporter: _RequestGrpcExporter | _RequestHttpExporter, name: str) -> None:
        self.name = name
        self._exporter = exporter
        self._failures = FailureLog(_log, name)
        self._is_shut_down = False

    def export(self, batch: SpanBatch) -> bool:
        return self.export_request(SerializedTraces(batch.payload, len(batch)))

    def export_request(self, request) -> bool:
        """Send a prebuilt OTLP request: a message (traces, or metrics for the metric sinks) or ``SerializedTraces``."""
        try:
            delivered = self._exporter.export_request(request)
        except Exception as exc:  # noqa: BLE001 - a sink never raises
            self._failures.failed(type(exc).__name__, exc)
            return False
        if delivered:
            self._failures.succeeded()
            _library_log_filter.rearm()
        else:
            self._failures.failed("not delivered", f"collector at {self._exporter.target} unreachable or refusing")
        return delivered

    def shutdown(self) -> None:
        """Also interrupts an export in progress (closes the channel / session)."""
        if self._is_shut_down:
            return
        self._is_shut_down = True
        try:
            self._exporter.shutdown()
        except Exception as exc:  # noqa: BLE001
            _log.debug("sink %s: shutdown error ignored: %s", self.name, exc)


class OtlpGrpcSink(_OtlpSink):
    """Exports to an OTLP/gRPC endpoint through the official gRPC span exporter."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        insecure: bool | None = None,
        name: str = "otlp",
    ) -> None:
        headers = dict(headers) if headers else None
        super().__init__(
            _RequestGrpcExporter(
                endpoint=endpoint, headers=headers, timeout=timeout_s, insecure=insecure, channel_options=RECONNECT_OPTIONS
            ),
            name,
        )


class OtlpHttpSink(_OtlpSink):
    """Exports to an OTLP/HTTP (protobuf) endpoint through the official HTTP span exporter."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        name: str = "otlp",
    ) -> None:
        url = traces_url(endpoint) if endpoint else None
        super().__init__(_RequestHttpExporter(endpoint=url, headers=headers, timeout=timeout_s), name)


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL for a base URL or a full ``.../v1/traces`` URL."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"OTLP/HTTP endpoint must be an http:// or https:// URL, got {endpoint!r}")
    if parts.path.rstrip("/").endswith("/v1/traces"):
        return endpoint
    return endpoint.rstrip("/") + "/v1/traces"


# --- the adapters: the only code that touches the exporters' internals -------


class _RequestGrpcExporter(grpc_trace_exporter.OTLPSpanExporter):
    """The official gRPC span exporter, fed a prebuilt request: ``SerializedTraces`` or a message."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        if getattr(self, "_stub", None) is not TraceServiceStub or getattr(self, "_channel", None) is None:
            raise RuntimeError(
                "opentelemetry-exporter-otlp-proto-grpc no longer builds its client as self._stub(self._channel); "
                "otelbpf.export.otlp._RequestGrpcExporter must be adapted to this version"
            )
        self._stub = _TraceServiceStub
        self._client = self._stub(self._channel)

    def _translate_data(  # type: ignore[override]
        self, data: SerializedTraces | ExportTraceServiceRequest
    ) -> bytes | ExportTraceServiceRequest:
        if isinstance(data, SerializedTraces):
            return data.payload
        if not isinstance(data, ExportTraceServiceRequest):
            raise TypeError(f"expected SerializedTraces or ExportTraceServiceRequest, got {type(data).__name__}")
        return data

    def _count_data(self, data: SerializedTraces | ExportTraceServiceRequest) -> int:  # type: ignore[override]
        if isinstance(data, SerializedTraces):
            return data.span_count
        return sum(len(scope.spans) for resource in data.resource_spans for scope in resource.scope_spans)

    @property
    def target(self) -> str:
        """The resolved host:port, for log messages."""
        return str(self._endpoint)

    def export_request(self, request: SerializedTraces | ExportTraceServiceRequest) -> bool:
        # export() -> OTLPExporterMixin._export() -> our _translate_data(): the retrying send path.
        return self.export(request) is SpanExportResult.SUCCESS  # type: ignore[arg-type]


def _serialize_trace_request(request: bytes | ExportTraceServiceRequest) -> bytes:
    return request if type(request) is bytes else request.SerializeToString()


class _TraceServiceStub:
    """``TraceServiceStub`` as generated (same method, same response decoding), except that its
    request serializer passes already serialized requests through."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.Export = channel.unary_unary(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            request_serializer=_serialize_trace_request,
            response_deserializer=ExportTraceServiceResponse.FromString,
            _registered_method=True,
        )


class _RequestHttpExporter(http_trace_exporter.OTLPSpanExporter):
    """The official HTTP span exporter, fed a prebuilt request: ``SerializedTraces`` or a message."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        if not callable(getattr(getattr(self, "_client", None), "export", None)):
            raise RuntimeError(
                "opentelemetry-exporter-otlp-proto-http no longer has OTLPSpanExporter._client.export(bytes); "
                "otelbpf.export.otlp._RequestHttpExporter must be adapted to this version"
            )

    @property
    def target(self) -> str:
        """The resolved URL, for log messages."""
        return str(self._endpoint)

    def export_request(self, request: SerializedTraces | ExportTraceServiceRequest) -> bool:
        if self._shutdown:
            return False
        payload = request.payload if isinstance(request, SerializedTraces) else request.SerializeToString()
        return bool(self._client.export(payload).success)


class _OncePerMessage(logging.Filter):
    """Lets each of the official exporters' messages through once per outage.

    They log every internal retry; our processor retries for as long as the
    collector is down, which would make that a line every few seconds for
    hours. Re-armed whenever an OTLP sink delivers again.
    """

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[tuple[str, object]] = set()
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.msg)
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
        return True

    def rearm(self) -> None:
        with self._lock:
            self._seen.clear()


_library_log_filter = _OncePerMessage()
for _name in _LIBRARY_LOGGERS:
    logging.getLogger(_name).addFilter(_library_log_filter)
