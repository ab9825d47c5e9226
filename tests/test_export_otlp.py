"""OTLP sinks against a real receiver: gRPC, HTTP, env configuration, retries.

These also pin the adapters onto the official exporters' internals
(otelbpf/otlp/transport.py): if a library upgrade moves those hooks, the
end-to-end tests here fail.
"""

from __future__ import annotations

from typing import Any, Mapping

import grpc
import pytest
from otlp_receiver import OtlpReceiver, free_port, otlp_receiver  # noqa: F401 - fixture

from otelbpf.core.model import ResourceLookup, SpanKind, SpanRecord
from otelbpf.core.selfmetrics import Counters
from otelbpf.export import BatchSpanProcessor, OtlpGrpcSink, OtlpHttpSink, SpanBatch, make_otlp_span_sink
from otelbpf.otlp import TRACES, resolve_transport, signal_url

OTLP_ENV = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_COMPRESSION",
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
    "OTEL_EXPORTER_OTLP_INSECURE",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
)


@pytest.fixture(autouse=True)
def clean_otlp_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTLP_ENV:
        monkeypatch.delenv(name, raising=False)


class StaticResources(ResourceLookup):
    def __init__(self, by_pid: Mapping[int, Mapping[str, Any]]) -> None:
        self.by_pid = by_pid

    def attributes(self, pid: int) -> Mapping[str, Any]:
        return self.by_pid.get(pid, {})


RESOURCES = StaticResources({1: {"service.name": "api"}, 2: {"service.name": "vllm"}})


def span(number: int, pid: int = 1, **overrides: Any) -> SpanRecord:
    fields: dict[str, Any] = dict(
        trace_id=bytes(16 * [9]),
        span_id=(number + 1).to_bytes(8, "big"),
        name=f"GET /item/{number}",
        kind=SpanKind.SERVER,
        start_ns=1_700_000_000_000_000_000,
        end_ns=1_700_000_000_002_000_000,
        pid=pid,
        attributes={"http.response.status_code": 200, "item": number},
    )
    fields.update(overrides)
    return SpanRecord(**fields)


def batch_of(count: int) -> SpanBatch:
    return SpanBatch([span(i, pid=1 + i % 2) for i in range(count)], RESOURCES)


def assert_received_exactly(receiver: OtlpReceiver, batch: SpanBatch) -> None:
    received = receiver.wait_for_spans(len(batch), timeout=10)
    by_id = {item.span.span_id: item for item in received}
    assert len(received) == len(by_id) == len(batch)
    for sent in batch.spans:
        got = by_id[sent.span_id]
        assert got.name == sent.name
        assert got.attributes["item"] == sent.attributes["item"]
        assert got.resource["service.name"] == ("api" if sent.pid == 1 else "vllm")
        assert got.scope == "otelbpf"


def test_grpc_sink_delivers_decodable_spans(otlp_receiver: OtlpReceiver) -> None:
    sink = OtlpGrpcSink(TRACES, otlp_receiver.grpc_endpoint)
    batch = batch_of(20)

    assert sink.export(batch) is True
    sink.shutdown()

    assert_received_exactly(otlp_receiver, batch)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_the_collector_receives_exactly_the_encoded_request(otlp_receiver: OtlpReceiver, protocol: str) -> None:
    """The sinks send SpanBatch.payload, the bytes the wire encoder wrote, without re-encoding them."""
    endpoint = otlp_receiver.grpc_endpoint if protocol == "grpc" else otlp_receiver.http_endpoint
    sink = make_otlp_span_sink(endpoint, protocol)
    batch = SpanBatch(
        [span(0, pid=1, parent_span_id=bytes(8 * [3]), trace_state="k=v"), span(1, pid=2, name="ünï <&>"),
         span(2, pid=1, attributes={"flag": True, "ratio": 0.5, "neg": -7, "s": ""})],
        RESOURCES,
    )

    assert sink.export(batch) is True
    sink.shutdown()

    otlp_receiver.wait_for_spans(len(batch), timeout=10)
    assert otlp_receiver.trace_requests == [batch.request]


def test_grpc_sink_still_sends_a_request_message(otlp_receiver: OtlpReceiver) -> None:
    """export_request takes an ExportTraceServiceRequest as before (serialized by the stub as the official one does)."""
    sink = OtlpGrpcSink(TRACES, otlp_receiver.grpc_endpoint)
    batch = batch_of(4)

    assert sink.export_request(batch.request) is True
    sink.shutdown()

    assert_received_exactly(otlp_receiver, batch)


@pytest.mark.parametrize("suffix", ["", "/", "/v1/traces"])
def test_http_sink_accepts_a_base_or_a_full_traces_url(otlp_receiver: OtlpReceiver, suffix: str) -> None:
    sink = OtlpHttpSink(TRACES, otlp_receiver.http_endpoint + suffix)
    batch = batch_of(20)

    assert sink.export(batch) is True
    sink.shutdown()

    assert_received_exactly(otlp_receiver, batch)


def traces_url(endpoint: str) -> str:
    return signal_url(endpoint, TRACES)


def test_traces_url() -> None:
    assert traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert traces_url("https://c:4318/prefix/") == "https://c:4318/prefix/v1/traces"
    assert traces_url("http://c:4318/v1/traces") == "http://c:4318/v1/traces"
    with pytest.raises(ValueError, match="http:// or https://"):
        traces_url("c:4318")


def test_protocol_comes_from_argument_then_env_then_defaults_to_grpc(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_transport() == "grpc"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    assert resolve_transport() == "http/protobuf"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    assert resolve_transport() == "grpc"
    assert resolve_transport("HTTP/Protobuf") == "http/protobuf"


@pytest.mark.parametrize("source", ["argument", "env"])
def test_unknown_protocol_is_rejected_listing_valid_values(monkeypatch: pytest.MonkeyPatch, source: str) -> None:
    if source == "env":
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
    with pytest.raises(ValueError, match=r"'http/json'.*valid values: grpc, http/protobuf"):
        make_otlp_span_sink("http://localhost:4317", "http/json" if source == "argument" else None)


def test_env_selects_http_endpoint_headers_and_gzip(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_receiver.http_endpoint)  # base: /v1/traces appended
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=acme,authorization=Bearer%20t0ken")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    sink = make_otlp_span_sink()
    batch = batch_of(5)

    assert isinstance(sink, OtlpHttpSink)
    assert sink.export(batch) is True
    sink.shutdown()

    assert_received_exactly(otlp_receiver, batch)
    headers = otlp_receiver.trace_headers[0]
    assert headers["x-tenant"] == "acme"
    assert headers["authorization"] == "Bearer t0ken"
    assert headers["content-encoding"] == "gzip"


def test_env_selects_grpc_traces_endpoint_and_headers(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # the signal-specific one wins
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp_receiver.grpc_endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-tenant=acme")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    sink = make_otlp_span_sink()
    batch = batch_of(5)

    assert isinstance(sink, OtlpGrpcSink)
    assert sink.export(batch) is True
    sink.shutdown()

    assert_received_exactly(otlp_receiver, batch)
    assert otlp_receiver.trace_headers[0]["x-tenant"] == "acme"


def test_explicit_endpoint_overrides_env(otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9/v1/traces")
    sink = make_otlp_span_sink(otlp_receiver.http_endpoint, "http/protobuf")

    assert sink.export(batch_of(3)) is True
    sink.shutdown()


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_unreachable_collector_is_a_false_return_not_an_exception(protocol: str) -> None:
    sink = make_otlp_span_sink(f"http://127.0.0.1:{free_port()}", protocol, timeout_s=0.5)

    assert sink.export(batch_of(3)) is False
    sink.shutdown()
    sink.shutdown()  # idempotent
    assert sink.export(batch_of(3)) is False  # after shutdown: refused, not raised


def retrying_processor(sink: Any, counters: Counters) -> BatchSpanProcessor:
    return BatchSpanProcessor(
        [sink], RESOURCES, counters, max_batch_size=10, schedule_delay_s=0.05, initial_backoff_s=0.05, max_backoff_s=0.2
    )


@pytest.mark.parametrize(
    "protocol, failure",
    [
        ("http/protobuf", {"http_status": 500}),  # not retryable for the library: the processor retries
        ("http/protobuf", {"http_status": 503}),  # retryable for the library too
        ("grpc", {"grpc_code": grpc.StatusCode.UNAVAILABLE}),
    ],
)
def test_transient_collector_errors_are_retried_without_duplicates(
    otlp_receiver: OtlpReceiver, protocol: str, failure: dict[str, Any]
) -> None:
    endpoint = otlp_receiver.grpc_endpoint if protocol == "grpc" else otlp_receiver.http_endpoint
    counters = Counters()
    processor = retrying_processor(make_otlp_span_sink(endpoint, protocol, timeout_s=0.5), counters)
    otlp_receiver.fail_next(2, **failure)
    batch = batch_of(10)

    for item in batch.spans:
        processor.on_end(item)
    assert processor.force_flush(timeout_s=10)
    processor.shutdown()

    assert otlp_receiver.failures_sent == 2
    assert_received_exactly(otlp_receiver, batch)
    assert counters.get("otelbpf.export.spans", "otlp") == 10
    assert counters.get("otelbpf.export.dropped", "otlp") == 0


def test_grpc_adapter_counts_spans_for_the_library_metrics() -> None:
    sink = OtlpGrpcSink(TRACES, "http://127.0.0.1:9", timeout_s=0.1)
    batch = batch_of(7)

    assert sink._exporter._count_data(batch.request) == 7
    sink.shutdown()
