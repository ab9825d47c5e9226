"""OTLP transports (gRPC and HTTP/protobuf) for any signal, built on the official exporters.

The official ``opentelemetry-exporter-otlp-proto-{grpc,http}`` exporters
already implement everything around the wire that is easy to get subtly
wrong: the OTEL_EXPORTER_OTLP_* / OTEL_EXPORTER_OTLP_{TRACES,METRICS}_*
variables (endpoint, headers, timeout, compression, insecure,
certificates), TLS and mTLS, gzip, and retries of transient errors (gRPC
UNAVAILABLE & co., HTTP 429/502/503/504, with Retry-After / RetryInfo). What
they lack is a way in for a request we encoded ourselves (they expect SDK
objects, too slow to build per request). The two small adapters below add
exactly that and nothing else, for any :class:`~otelbpf.otlp.signals.Signal`.
A request goes out as the bytes it was encoded to (``SerializedRequest``, or
anything with ``.payload`` and ``len()`` such as a ``SpanBatch``): parsing
them into a message only for the exporter to serialize it again would cost
~2 us per span each way. A request message is accepted too (serialized once).

* gRPC: ``OTLPExporterMixin._export`` calls ``self._translate_data(data)`` to
  make the request and ``self._count_data(data)`` for the exporter's own
  metrics; both are abstract hooks of the mixin. The adapter implements them
  (pass the bytes through, count items) and calls the public ``export()``.
  The request reaches the channel through the mixin's stub,
  ``self._stub(channel)`` (a generated ``*ServiceStub``, whose request
  serializer only takes messages); the adapter sets ``_stub`` to
  ``ExportStub`` for the signal (its gRPC method, its response decoding, a
  serializer that passes bytes through) and rebuilds ``_client`` from it (the
  mixin rebuilds it from ``_stub`` when it reconnects).
* HTTP: the official exporters hand serialized bytes to
  ``self._client.export(data)`` (an ``_OTLPHTTPClient``, which compresses,
  posts and retries). The adapter calls that client with our bytes
  (skipping only the exporter's optional self-metrics and its 64 MiB
  request-size guard, far above our request sizes).

Those hooks are private, so each adapter's constructor checks that they are
still there and fails loudly otherwise (verified against 1.45.2);
tests/test_export_otlp.py and tests/test_metrics.py exercise both adapters
end to end against a real receiver, so a library upgrade that moves them
fails the tests.

Which official exporter carries a signal: traces the span exporters,
metrics the metric exporters (so each reads its own OTEL_EXPORTER_OTLP_
{TRACES,METRICS}_* variables). There is no official profiles exporter yet:
profiles ride on the span exporters (their OTEL_EXPORTER_OTLP_TRACES_*
headers, timeout, compression and TLS apply), with the endpoint taken from
OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT here and
the profiles path / method on the wire.

Outages are the caller's business (the span queue retries with backoff and
keeps order; the metrics exporter sends the next cumulative collection);
these sinks report True/False and log each kind of failure once. The
official exporters log every internal retry; ``library_log_filter`` lets
each of their messages through once per outage, so a collector that is down
for hours does not fill the log.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from typing import Any, Mapping
from urllib.parse import urlsplit

import grpc
from opentelemetry.exporter.otlp.proto.grpc import metric_exporter as grpc_metric_exporter
from opentelemetry.exporter.otlp.proto.grpc import trace_exporter as grpc_trace_exporter
from opentelemetry.exporter.otlp.proto.http import metric_exporter as http_metric_exporter
from opentelemetry.exporter.otlp.proto.http import trace_exporter as http_trace_exporter
from opentelemetry.sdk.metrics.export import MetricExportResult
from opentelemetry.sdk.trace.export import SpanExportResult

from otelbpf.otlp import GRPC, OTLP_TRANSPORTS, hints
from otelbpf.otlp.signals import METRICS, SIGNALS, TRACES, Signal
from otelbpf.otlp.sink import FailureLog, Sink

_log = logging.getLogger(__name__)

#: gRPC's own reconnect backoff grows to 120 s after a few failed attempts,
#: so a collector that restarts would be reached minutes late while data
#: queues up. Cap it: reconnecting is cheap next to a full queue.
RECONNECT_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 5000),
)


_SUCCESS = (SpanExportResult.SUCCESS, MetricExportResult.SUCCESS)


def resolve_transport(protocol: str | None = None, signal: Signal = TRACES) -> str:
    """``protocol``, else OTEL_EXPORTER_OTLP_{signal}_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL, else grpc."""
    source = "protocol argument"
    if not protocol:
        for variable in (f"OTEL_EXPORTER_OTLP_{signal.env}_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
            protocol = os.environ.get(variable, "").strip()
            if protocol:
                source = variable
                break
    value = (protocol or GRPC).strip().lower()
    if value not in OTLP_TRANSPORTS:
        valid = ", ".join(OTLP_TRANSPORTS)
        raise ValueError(f"unsupported OTLP protocol {protocol!r} (from {source}); valid values: {valid}")
    return value


def make_otlp_sink(
    signal: Signal,
    endpoint: str | None = None,
    protocol: str | None = None,
    *,
    timeout_s: float | None = None,
    name: str | None = None,
) -> OtlpSink:
    """The ``signal``'s OTLP sink for ``protocol`` (else the OTEL_EXPORTER_OTLP_*PROTOCOL variables, else grpc).

    ``endpoint`` overrides the OTEL_EXPORTER_OTLP_*ENDPOINT variables. For
    http/protobuf a base URL (``http://host:4318``, gets the signal's path,
    e.g. ``/v1/traces``), the signal's full URL and another signal's full URL
    (its path replaced: one ``--otlp-endpoint`` serves all signals) are
    accepted. For grpc an ``http://`` endpoint means plaintext, ``https://``
    or no scheme means TLS (unless OTEL_EXPORTER_OTLP_INSECURE=true), as in
    the official exporters.
    """
    if resolve_transport(protocol, signal) == GRPC:
        return OtlpGrpcSink(signal, endpoint, timeout_s=timeout_s, name=name)
    return OtlpHttpSink(signal, endpoint, timeout_s=timeout_s, name=name)


def signal_url(endpoint: str, signal: Signal) -> str:
    """The OTLP/HTTP URL of ``signal`` for a base URL, or a full URL of this or another signal."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"OTLP/HTTP endpoint must be an http:// or https:// URL, got {endpoint!r}")
    path = parts.path.rstrip("/")
    if path.endswith(signal.http_path):
        return endpoint
    for other in SIGNALS:
        if path.endswith(other.http_path):
            return parts._replace(path=path[: -len(other.http_path)] + signal.http_path).geturl()
    return endpoint.rstrip("/") + signal.http_path


class SerializedRequest:
    """A signal's Export request already serialized, and how many items (spans, data points ...) it holds."""

    __slots__ = ("payload", "item_count")

    def __init__(self, payload: bytes, item_count: int) -> None:
        self.payload = payload
        self.item_count = item_count

    def __len__(self) -> int:
        return self.item_count


class OtlpSink(Sink[Any]):
    """Sends prebuilt requests of one signal through an adapter; True/False, each kind of failure logged once.

    ``export`` takes the signal's request message, or anything holding the
    serialized request as ``.payload`` with its item count as ``len()``
    (``SerializedRequest``, ``SpanBatch``)."""

    reads_payload_only = True

    def __init__(self, signal: Signal, exporter: _GrpcAdapter | _HttpAdapter, name: str | None) -> None:
        self.signal = signal
        self.name = name or signal.sink_name
        self._exporter = exporter
        self._failures = FailureLog(_log, self.name)
        self._is_shut_down = False
        self._diagnosed = False

    def export(self, request: Any) -> bool:
        try:
            if isinstance(request, self.signal.request_type):
                request = SerializedRequest(request.SerializeToString(), self.signal.count(request))
            delivered = self._exporter.export_request(request)
        except Exception as exc:  # noqa: BLE001 - a sink never raises
            self._failures.failed(type(exc).__name__, exc)
            return False
        if delivered:
            self._failures.succeeded()
            library_log_filter.rearm()
        else:
            self._failures.failed("not delivered", self._why_not_delivered())
        return delivered

    def _why_not_delivered(self) -> str:
        """The generic reason, or, once, the port's transport when it is the other one (otelbpf.otlp.hints)."""
        target = self._exporter.target
        if not self._diagnosed:
            self._diagnosed = True
            transport = GRPC if isinstance(self._exporter, _GrpcAdapter) else "http/protobuf"
            wrong = hints.wrong_transport(target, transport)
            if wrong:
                return f"wrong port for {transport}: {wrong}"
        return f"collector at {target} unreachable or refusing"

    #: The name the span sinks had for it; same thing.
    export_request = export

    def shutdown(self) -> None:
        """Also interrupts an export in progress (closes the channel / session)."""
        if self._is_shut_down:
            return
        self._is_shut_down = True
        try:
            self._exporter.shutdown()
        except Exception as exc:  # noqa: BLE001
            _log.debug("sink %s: shutdown error ignored: %s", self.name, exc)


class OtlpGrpcSink(OtlpSink):
    """Exports ``signal`` to an OTLP/gRPC endpoint through the official gRPC exporter."""

    def __init__(
        self,
        signal: Signal,
        endpoint: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        insecure: bool | None = None,
        name: str | None = None,
    ) -> None:
        adapter = _grpc_adapter_class(signal)
        exporter = adapter(
            signal,
            endpoint=endpoint or _endpoint_from_env(signal),
            headers=dict(headers) if headers else None,
            timeout=timeout_s,
            insecure=insecure,
            channel_options=RECONNECT_OPTIONS,
        )
        super().__init__(signal, exporter, name)


class OtlpHttpSink(OtlpSink):
    """Exports ``signal`` to an OTLP/HTTP (protobuf) endpoint through the official HTTP exporter."""

    def __init__(
        self,
        signal: Signal,
        endpoint: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        name: str | None = None,
    ) -> None:
        endpoint = endpoint or _endpoint_from_env(signal)
        url = signal_url(endpoint, signal) if endpoint else None
        adapter = _http_adapter_class(signal)
        super().__init__(signal, adapter(signal, endpoint=url, headers=headers, timeout=timeout_s), name)


def _official_exporters(signal: Signal) -> tuple[type, type, Signal]:
    """(gRPC exporter class, HTTP exporter class, the signal they are made for) carrying ``signal``."""
    if signal is METRICS:
        return grpc_metric_exporter.OTLPMetricExporter, http_metric_exporter.OTLPMetricExporter, METRICS
    return grpc_trace_exporter.OTLPSpanExporter, http_trace_exporter.OTLPSpanExporter, TRACES


def _endpoint_from_env(signal: Signal) -> str | None:
    """For a signal without an official exporter (profiles): its endpoint variable, else the generic one.
    None for the others: their official exporter reads the variables itself."""
    if _official_exporters(signal)[2] is signal:
        return None
    return (
        os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.env}_ENDPOINT", "").strip()
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        or None
    )


# --- the adapters: the only code that touches the exporters' internals -------


class _GrpcAdapter:
    """Mixed in before an official gRPC exporter: feeds it a prebuilt request of ``signal``."""

    def __init__(self, signal: Signal, **kwargs: Any) -> None:
        super().__init__(**kwargs)  # type: ignore[call-arg]
        if not isinstance(getattr(self, "_stub", None), type) or getattr(self, "_channel", None) is None:
            raise RuntimeError(
                "opentelemetry-exporter-otlp-proto-grpc no longer builds its client as self._stub(self._channel); "
                "otelbpf.otlp.transport._GrpcAdapter must be adapted to this version"
            )
        self._otlp_signal = signal
        self._stub = functools.partial(ExportStub, signal)
        self._client = self._stub(self._channel)

    def _translate_data(self, data: SerializedRequest | Any) -> bytes:
        return data.payload

    def _count_data(self, data: SerializedRequest | Any) -> int:
        if isinstance(data, self._otlp_signal.request_type):
            return self._otlp_signal.count(data)
        return len(data)

    @property
    def target(self) -> str:
        """The resolved host:port, for log messages."""
        return str(self._endpoint)  # type: ignore[attr-defined]

    def export_request(self, request: SerializedRequest | Any) -> bool:
        # export() -> OTLPExporterMixin._export() -> our _translate_data(): the retrying send path.
        return self.export(request) in _SUCCESS  # type: ignore[attr-defined]


class _HttpAdapter:
    """Mixed in before an official HTTP exporter: feeds it a prebuilt request of ``signal``."""

    def __init__(self, signal: Signal, **kwargs: Any) -> None:
        super().__init__(**kwargs)  # type: ignore[call-arg]
        if not callable(getattr(getattr(self, "_client", None), "export", None)):
            raise RuntimeError(
                "opentelemetry-exporter-otlp-proto-http no longer has _client.export(bytes); "
                "otelbpf.otlp.transport._HttpAdapter must be adapted to this version"
            )

    @property
    def target(self) -> str:
        """The resolved URL, for log messages."""
        return str(self._endpoint)  # type: ignore[attr-defined]

    def export_request(self, request: SerializedRequest | Any) -> bool:
        if self._shutdown:  # type: ignore[attr-defined]
            return False
        return bool(self._client.export(request.payload).success)  # type: ignore[attr-defined]


@functools.cache
def _grpc_adapter_class(signal: Signal) -> type:
    official = _official_exporters(signal)[0]
    return type(f"_Grpc{signal.name.title()}Adapter", (_GrpcAdapter, official), {})


@functools.cache
def _http_adapter_class(signal: Signal) -> type:
    official = _official_exporters(signal)[1]
    return type(f"_Http{signal.name.title()}Adapter", (_HttpAdapter, official), {})


def _pass_bytes_through(request: bytes | Any) -> bytes:
    return request if type(request) is bytes else request.SerializeToString()


class ExportStub:
    """A generated ``*ServiceStub`` for ``signal`` (same method, same response decoding),
    except that its request serializer passes already serialized requests through."""

    def __init__(self, signal: Signal, channel: grpc.Channel) -> None:
        self.Export = channel.unary_unary(
            signal.grpc_method,
            request_serializer=_pass_bytes_through,
            response_deserializer=signal.response_type.FromString,
            _registered_method=True,
        )


# --- the official exporters' per-retry log lines --------------------------------


class OncePerMessage(logging.Filter):
    """Lets each of the official exporters' messages through once per outage.

    They log every internal retry; the span queue retries for as long as the
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


#: Loggers of the official exporters; they log every internal retry.
LIBRARY_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    http_trace_exporter.__name__,
    http_metric_exporter.__name__,
    "opentelemetry.exporter.otlp.common.http",
)

library_log_filter = OncePerMessage()
for _name in LIBRARY_LOGGERS:
    logging.getLogger(_name).addFilter(hints.metrics_refused_hint)  # first: sees every record
    logging.getLogger(_name).addFilter(hints.library_chatter)
    logging.getLogger(_name).addFilter(library_log_filter)
