"""A real OTLP receiver for tests: gRPC and HTTP/protobuf, traces, metrics and profiles.

It decodes the official ``opentelemetry-proto`` messages, so whatever it
records is what a Collector would have received. Use it from any test, in
process or with the agent running as a separate process::

    from otlp_receiver import OtlpReceiver

    with OtlpReceiver() as receiver:                     # ephemeral ports
        run_agent(endpoint=receiver.grpc_endpoint)       # or receiver.http_endpoint
        spans = receiver.wait_for_spans(3, timeout=10)
        assert spans[0].resource["service.name"] == "api"

Features: ``fail_next(n)`` answers the next n export calls with a failure
(gRPC UNAVAILABLE / HTTP 503 by default); ``OtlpReceiver(grpc_port=port)``
with a port from ``free_port()`` starts on a fixed port, e.g. later than the
exporter (a collector that comes up late); headers/metadata of each request
are kept. This module is plain Python (no pytest plugin); the
``otlp_receiver`` fixture at the bottom can be imported into a test module.
"""

from __future__ import annotations

import gzip
import socket
import threading
import time
import zlib
from concurrent import futures
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable, Iterator

import grpc
import pytest
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2, profiles_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

ExportTraceServiceRequest = trace_service_pb2.ExportTraceServiceRequest
ExportMetricsServiceRequest = metrics_service_pb2.ExportMetricsServiceRequest
ExportProfilesServiceRequest = profiles_service_pb2.ExportProfilesServiceRequest
#: OTLP/HTTP path of each signal the receiver serves.
PROFILES_PATH = "/v1development/profiles"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now (to start a receiver on it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def any_value(value: AnyValue) -> Any:
    """An OTLP AnyValue as a plain Python value (arrays as lists, kvlists as dicts)."""
    which = value.WhichOneof("value")
    if which == "array_value":
        return [any_value(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return attributes_dict(value.kvlist_value.values)
    return getattr(value, which) if which else None


def attributes_dict(key_values: Iterable[KeyValue]) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in key_values}


@dataclass(frozen=True)
class ReceivedSpan:
    """One received span with the resource and scope it arrived under."""

    span: Span
    resource: dict[str, Any]
    scope: str
    scope_version: str

    @property
    def name(self) -> str:
        return self.span.name

    @property
    def attributes(self) -> dict[str, Any]:
        return attributes_dict(self.span.attributes)


@dataclass
class _InjectedFailures:
    remaining: int = 0
    grpc_code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    http_status: int = 503
    sent: int = 0


class OtlpReceiver:
    """OTLP/gRPC and OTLP/HTTP servers recording decoded requests. Pass a port of None to skip a server."""

    def __init__(
        self, grpc_port: int | None = 0, http_port: int | None = 0, host: str = "127.0.0.1", serve_metrics: bool = True
    ) -> None:
        """``serve_metrics=False``: a traces-only backend (Jaeger, Tempo): metrics get
        gRPC UNIMPLEMENTED / HTTP 404."""
        self.host = host
        self.serve_metrics = serve_metrics
        self.grpc_port = grpc_port
        self.http_port = http_port
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._trace_requests: list[ExportTraceServiceRequest] = []
        self._trace_headers: list[dict[str, str]] = []
        self._metric_requests: list[ExportMetricsServiceRequest] = []
        self._profile_requests: list[ExportProfilesServiceRequest] = []
        self._failures = _InjectedFailures()
        self._grpc_server: grpc.Server | None = None
        self._http_server: ThreadingHTTPServer | None = None

    # --- lifecycle ------------------------------------------------------------

    def start(self) -> OtlpReceiver:
        if self.grpc_port is not None:
            self._start_grpc(self.grpc_port)
        if self.http_port is not None:
            self._start_http(self.http_port)
        return self

    def stop(self) -> None:
        if self._grpc_server is not None:
            self._grpc_server.stop(grace=None).wait()
            self._grpc_server = None
        if self._http_server is not None:
            self._http_server.shutdown()
            self._http_server.server_close()
            self._http_server = None

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def grpc_endpoint(self) -> str:
        """``http://host:port`` (plaintext gRPC, as the exporters expect it)."""
        return f"http://{self.host}:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        """Base URL; traces go to ``/v1/traces``, metrics to ``/v1/metrics``."""
        return f"http://{self.host}:{self.http_port}"

    # --- what arrived ---------------------------------------------------------

    @property
    def trace_requests(self) -> list[ExportTraceServiceRequest]:
        with self._lock:
            return list(self._trace_requests)

    @property
    def trace_headers(self) -> list[dict[str, str]]:
        """Per trace request (same order): gRPC metadata or HTTP headers, keys lower-case."""
        with self._lock:
            return list(self._trace_headers)

    @property
    def metric_requests(self) -> list[ExportMetricsServiceRequest]:
        with self._lock:
            return list(self._metric_requests)

    @property
    def profile_requests(self) -> list[ExportProfilesServiceRequest]:
        """Profiles requests (gRPC ProfilesService/Export or HTTP POST /v1development/profiles), decoded."""
        with self._lock:
            return list(self._profile_requests)

    def wait_for_profile_requests(self, count: int = 1, timeout: float = 10.0) -> list[ExportProfilesServiceRequest]:
        self._wait(lambda: len(self._profile_requests) >= count, timeout)
        requests = self.profile_requests
        assert len(requests) >= count, f"expected {count} profiles requests within {timeout}s, got {len(requests)}"
        return requests

    def spans(self) -> list[ReceivedSpan]:
        return list(_flatten(self.trace_requests))

    def wait_for_spans(self, count: int, timeout: float = 10.0) -> list[ReceivedSpan]:
        """Wait until at least ``count`` spans arrived; AssertionError (with what did arrive) on timeout."""
        self._wait(lambda: sum(1 for _ in _flatten(self._trace_requests)) >= count, timeout)
        spans = self.spans()
        assert len(spans) >= count, f"expected {count} spans within {timeout}s, got {len(spans)}"
        return spans

    def wait_for_metric_requests(self, count: int = 1, timeout: float = 10.0) -> list[ExportMetricsServiceRequest]:
        self._wait(lambda: len(self._metric_requests) >= count, timeout)
        requests = self.metric_requests
        assert len(requests) >= count, f"expected {count} metric requests within {timeout}s, got {len(requests)}"
        return requests

    def _wait(self, done: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._arrived:
            while not done():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._arrived.wait(remaining)

    def clear(self) -> None:
        with self._lock:
            self._trace_requests.clear()
            self._trace_headers.clear()
            self._metric_requests.clear()
            self._profile_requests.clear()

    # --- failure injection --------------------------------------------------------

    def fail_next(
        self, count: int, *, grpc_code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE, http_status: int = 503
    ) -> None:
        """Answer the next ``count`` export calls (either protocol) with a failure; they are not recorded."""
        with self._lock:
            self._failures = _InjectedFailures(count, grpc_code, http_status)

    @property
    def failures_sent(self) -> int:
        with self._lock:
            return self._failures.sent

    def _take_injected_failure(self) -> _InjectedFailures | None:
        with self._lock:
            if self._failures.remaining <= 0:
                return None
            self._failures.remaining -= 1
            self._failures.sent += 1
            return self._failures

    def _record_traces(self, request: ExportTraceServiceRequest, headers: dict[str, str]) -> None:
        with self._arrived:
            self._trace_requests.append(request)
            self._trace_headers.append(headers)
            self._arrived.notify_all()

    def _record_metrics(self, request: ExportMetricsServiceRequest) -> None:
        with self._arrived:
            self._metric_requests.append(request)
            self._arrived.notify_all()

    def _record_profiles(self, request: ExportProfilesServiceRequest) -> None:
        with self._arrived:
            self._profile_requests.append(request)
            self._arrived.notify_all()

    # --- servers --------------------------------------------------------------------

    def _start_grpc(self, port: int) -> None:
        # so_reuseport off: binding a port another server holds must fail, not share it.
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=[("grpc.so_reuseport", 0)])
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_GrpcTraceService(self), server)
        if self.serve_metrics:
            metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_GrpcMetricsService(self), server)
        profiles_service_pb2_grpc.add_ProfilesServiceServicer_to_server(_GrpcProfilesService(self), server)
        bound = server.add_insecure_port(f"{self.host}:{port}")
        if not bound:
            raise OSError(f"gRPC receiver could not bind {self.host}:{port}")
        server.start()
        self.grpc_port = bound
        self._grpc_server = server

    def _start_http(self, port: int) -> None:
        server = ThreadingHTTPServer((self.host, port), _http_handler_for(self))
        server.daemon_threads = True
        serve = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        serve.start()
        self.http_port = int(server.server_address[1])
        self._http_server = server


def _flatten(requests: Iterable[ExportTraceServiceRequest]) -> Iterator[ReceivedSpan]:
    for request in requests:
        for resource_spans in request.resource_spans:
            resource = attributes_dict(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    yield ReceivedSpan(span, resource, scope_spans.scope.name, scope_spans.scope.version)


class _GrpcTraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(self, request: ExportTraceServiceRequest, context: grpc.ServicerContext) -> Any:  # noqa: N802
        failure = self._receiver._take_injected_failure()
        if failure is not None:
            context.abort(failure.grpc_code, "injected failure")
        metadata = {key.lower(): str(value) for key, value in context.invocation_metadata()}
        self._receiver._record_traces(request, metadata)
        return trace_service_pb2.ExportTraceServiceResponse()


class _GrpcMetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(self, request: ExportMetricsServiceRequest, context: grpc.ServicerContext) -> Any:  # noqa: N802
        failure = self._receiver._take_injected_failure()
        if failure is not None:
            context.abort(failure.grpc_code, "injected failure")
        self._receiver._record_metrics(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


class _GrpcProfilesService(profiles_service_pb2_grpc.ProfilesServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(self, request: ExportProfilesServiceRequest, context: grpc.ServicerContext) -> Any:  # noqa: N802
        failure = self._receiver._take_injected_failure()
        if failure is not None:
            context.abort(failure.grpc_code, "injected failure")
        self._receiver._record_profiles(request)
        return profiles_service_pb2.ExportProfilesServiceResponse()


def _http_handler_for(receiver: OtlpReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as exporters reuse connections

        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path not in ("/v1/traces", "/v1/metrics", PROFILES_PATH) or (self.path == "/v1/metrics" and not receiver.serve_metrics):
                return self._reply(HTTPStatus.NOT_FOUND)
            if not (self.headers.get("Content-Type") or "").startswith("application/x-protobuf"):
                return self._reply(HTTPStatus.UNSUPPORTED_MEDIA_TYPE)
            failure = receiver._take_injected_failure()
            if failure is not None:
                return self._reply(failure.http_status)
            try:
                payload = _decompress(body, self.headers.get("Content-Encoding") or "")
                self._record(payload)
            except (DecodeError, OSError, zlib.error, EOFError):
                return self._reply(HTTPStatus.BAD_REQUEST)
            response = {
                "/v1/traces": trace_service_pb2.ExportTraceServiceResponse,
                PROFILES_PATH: profiles_service_pb2.ExportProfilesServiceResponse,
            }.get(self.path, metrics_service_pb2.ExportMetricsServiceResponse)()
            self._reply(HTTPStatus.OK, response.SerializeToString())

        def _record(self, payload: bytes) -> None:
            if self.path == "/v1/traces":
                headers = {key.lower(): value for key, value in self.headers.items()}
                receiver._record_traces(ExportTraceServiceRequest.FromString(payload), headers)
            elif self.path == PROFILES_PATH:
                receiver._record_profiles(ExportProfilesServiceRequest.FromString(payload))
            else:
                receiver._record_metrics(ExportMetricsServiceRequest.FromString(payload))

        def _reply(self, status: int, body: bytes = b"") -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep test output quiet
            pass

    return Handler


def _decompress(body: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    return body


@pytest.fixture
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """A started receiver on ephemeral ports (import into a test module to use)."""
    with OtlpReceiver() as receiver:
        yield receiver
