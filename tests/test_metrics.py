"""HTTP metrics and self-metrics: aggregation, OTLP encoding, export to a real receiver.

Everything here is the real code path; the receiver (tests/otlp_receiver.py)
decodes with the official opentelemetry-proto messages, so what it records
is what a Collector would have received. The OTLP tests also pin the metric
adapters onto the official exporters' internals (otelbpf/metrics/sinks.py).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterator, Mapping

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, Metric
from otlp_receiver import OtlpReceiver, attributes_dict, free_port, otlp_receiver  # noqa: F401 - fixture

import otelbpf
from otelbpf.core.connections import Connection
from otelbpf.core.identity import SpanStart, TraceGroup
from otelbpf.core.model import ResourceLookup, SpanKind, SpanRecord
from otelbpf.core.selfmetrics import Counters
from otelbpf.host.resources import ProcessResources
from otelbpf.metrics import (
    MeteredProcessor,
    MetricsExporter,
    MetricsJsonFileSink,
    SpanHistogram,
    SpanMetrics,
    agent_resource_attributes,
    encode_metrics,
    make_otlp_metric_sink,
    metrics_json_path,
    read_metrics_json_file,
    resolve_interval,
)
from otelbpf.metrics.http1 import INSTRUMENTS as HTTP1_INSTRUMENTS
from otelbpf.metrics.instruments import of_kind
from otelbpf.otlp import METRICS, PROFILES, OtlpGrpcSink, OtlpHttpSink, resolve_transport, signal_url
from otelbpf.registry import default_instruments
from otelbpf.semantics import SpanOptions
from otelbpf.semantics.http1 import SEMANTICS as HTTP1_SEMANTICS
from otelbpf.semconv import (
    HTTP_CLIENT_REQUEST_DURATION as CLIENT_DURATION,
    HTTP_DURATION_BOUNDARIES as DURATION_BOUNDARIES,
    HTTP_SERVER_REQUEST_DURATION as SERVER_DURATION,
)
from protocols.base import Outcome
from protocols.http1.types import HttpExchange, HttpRequest, HttpResponse

CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
OTLP_ENV = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
    "OTEL_EXPORTER_OTLP_COMPRESSION",
    "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION",
    "OTEL_EXPORTER_OTLP_INSECURE",
    "OTEL_EXPORTER_OTLP_METRICS_INSECURE",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
    "OTEL_METRIC_EXPORT_INTERVAL",
    "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_SERVICE_NAME",
)
START_NS = 1_700_000_000_000_000_000
DATA = Path(__file__).parent / "data"


@pytest.fixture(autouse=True)
def clean_otlp_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTLP_ENV:
        monkeypatch.delenv(name, raising=False)


class StaticResources(ResourceLookup):
    def __init__(self, by_pid: Mapping[int, Mapping[str, Any]]) -> None:
        self.by_pid = by_pid

    def attributes(self, pid: int) -> Mapping[str, Any]:
        return self.by_pid.get(pid, {})


RESOURCES = StaticResources(
    {1: {"service.name": "api", "process.pid": 1}, 2: {"service.name": "vllm", "process.pid": 2}}
)
SERVER_ATTRS = {
    "http.request.method": "GET",
    "http.response.status_code": 200,
    "http.route": "/users/{id}",
    "network.protocol.name": "http",
    "network.protocol.version": "1.1",
    "url.scheme": "http",
}


def http_metrics(resources: ResourceLookup, **kwargs: Any) -> SpanMetrics:
    """The aggregator with the HTTP/1 instruments (what the CLI wires in)."""
    return SpanMetrics(resources, {"http1": HTTP1_INSTRUMENTS}, **kwargs)


def metrics_url(endpoint: str) -> str:
    return signal_url(endpoint, METRICS)


def resolve_metrics_protocol(protocol: str | None = None) -> str:
    return resolve_transport(protocol, METRICS)


def span(
    duration_ns: int = 2_000_000, *, pid: int = 1, kind: SpanKind = SpanKind.SERVER, **attributes: Any
) -> SpanRecord:
    attrs = dict(SERVER_ATTRS)
    attrs.update({key.replace("__", "."): value for key, value in attributes.items()})
    return SpanRecord(
        trace_id=bytes(16 * [9]),
        span_id=bytes(8 * [7]),
        name="GET",
        kind=kind,
        start_ns=START_NS,
        end_ns=START_NS + duration_ns,
        pid=pid,
        attributes=attrs,
        protocol="http1",
    )


def metrics_of(requests: list[ExportMetricsServiceRequest]) -> Iterator[tuple[dict[str, Any], Metric]]:
    """(resource attributes, metric) for every metric in the requests."""
    for request in requests:
        for resource_metrics in request.resource_metrics:
            resource = attributes_dict(resource_metrics.resource.attributes)
            for scope_metrics in resource_metrics.scope_metrics:
                assert scope_metrics.scope.name == "otelbpf"
                assert scope_metrics.scope.version == otelbpf.__version__
                for metric in scope_metrics.metrics:
                    yield resource, metric


def histogram_points(requests: list[ExportMetricsServiceRequest], name: str) -> list[tuple[dict[str, Any], Any]]:
    return [
        (resource, point) for resource, metric in metrics_of(requests) if metric.name == name
        for point in metric.histogram.data_points
    ]  # fmt: skip


def recorded_count(requests: list[ExportMetricsServiceRequest]) -> int:
    return sum(
        point.count for name in (SERVER_DURATION, CLIENT_DURATION) for _, point in histogram_points(requests, name)
    )


def sums_by_name(requests: list[ExportMetricsServiceRequest]) -> dict[str, Metric]:
    return {metric.name: metric for _, metric in metrics_of(requests) if metric.WhichOneof("data") == "sum"}


def some_counters() -> Counters:
    counters = Counters()
    counters.add("otelbpf.events", 10)
    return counters


def exporter_for(span_metrics: SpanMetrics | None, counters: Counters, sinks: list, **kwargs: Any) -> MetricsExporter:
    kwargs.setdefault("interval_s", 3600.0)
    return MetricsExporter(span_metrics, counters, {"service.name": "otelbpf"}, sinks, **kwargs)


# --- aggregation ----------------------------------------------------------------------


def test_bucket_i_counts_values_up_to_and_including_boundary_i() -> None:
    metrics = http_metrics(RESOURCES)
    expected = [0] * (len(DURATION_BOUNDARIES) + 1)
    durations_ns = [0, -5]  # a zero and a (clamped) negative duration: bucket 0
    expected[0] += 2
    for i, boundary in enumerate(DURATION_BOUNDARIES):
        at = round(boundary * 1e9)
        durations_ns += [at, at + 1]  # exactly on the boundary, and 1 ns above
        expected[i] += 1
        expected[i + 1] += 1
    durations_ns.append(60_000_000_000)
    expected[-1] += 1
    for duration in durations_ns:
        metrics.record(span(duration))

    (process,) = metrics.collect().processes
    (point,) = process.points(SERVER_DURATION)
    assert list(point.bucket_counts) == expected
    assert point.count == len(durations_ns) == sum(expected)
    assert point.min == 0.0 and point.max == 60.0
    assert point.sum == pytest.approx(sum(max(d, 0) for d in durations_ns) / 1e9)


def _exchange(status: int | None, *, method: str = "GET", target: str = "/users/42?token=s3cret") -> HttpExchange:
    request = HttpRequest(
        method=method, target=target, headers=[("host", "api.internal:8080"), ("user-agent", "curl/8")],
        start_ns=START_NS, end_ns=START_NS + 1_000,
    )  # fmt: skip
    response = None
    if status is not None:
        response = HttpResponse(status=status, start_ns=START_NS + 2_000, end_ns=START_NS + 3_000_000)
    return HttpExchange(request, response, outcome=Outcome.COMPLETE if response else Outcome.CONNECTION_CLOSED)


def _connection() -> Connection:
    conn = Connection(conn_id=1, pid=1, fd=3, opened_ns=START_NS)
    conn.local_addr, conn.local_port, conn.peer_addr, conn.peer_port = "10.0.0.1", 8080, "10.0.0.2", 51234
    return conn


def _real_span(kind: SpanKind, exchange: HttpExchange) -> SpanRecord:
    start = SpanStart(TraceGroup(bytes(16 * [1])), bytes(8 * [2]), b"", kind, pid=1, tid=1)
    return HTTP1_SEMANTICS.span(start, exchange, _connection(), SpanOptions(include_query=True))


def test_attributes_follow_the_semantic_conventions_and_leave_out_high_cardinality_ones() -> None:
    metrics = http_metrics(RESOURCES)
    server_span = _real_span(SpanKind.SERVER, _exchange(503))
    client_span = _real_span(SpanKind.CLIENT, _exchange(200, method="POST"))
    aborted_client = _real_span(SpanKind.CLIENT, _exchange(None))
    for record in (server_span, client_span, aborted_client):
        metrics.record(record)
    # The spans do carry what must not become a metric attribute:
    assert {"url.path", "client.address", "network.peer.address", "server.address"} <= server_span.attributes.keys()
    assert {"url.full", "network.peer.port", "user_agent.original"} <= client_span.attributes.keys()

    (process,) = metrics.collect().processes
    assert [point.attributes for point in process.points(SERVER_DURATION)] == [
        {
            "http.request.method": "GET",
            "http.response.status_code": 503,
            "http.route": "/users/{id}",
            "error.type": "503",
            "network.protocol.name": "http",
            "network.protocol.version": "1.1",
            "url.scheme": "http",
        }
    ]
    assert sorted((point.attributes for point in process.points(CLIENT_DURATION)), key=lambda a: a["http.request.method"]) == [
        {
            "http.request.method": "GET",
            "error.type": "connection_closed",
            "network.protocol.name": "http",
            "network.protocol.version": "1.1",
            "server.address": "api.internal",
            "server.port": 8080,
        },
        {
            "http.request.method": "POST",
            "http.response.status_code": 200,
            "network.protocol.name": "http",
            "network.protocol.version": "1.1",
            "server.address": "api.internal",
            "server.port": 8080,
        },
    ]


def test_spans_differing_only_in_path_or_peer_share_a_series() -> None:
    metrics = http_metrics(RESOURCES)
    for i in range(50):
        metrics.record(span(url__path=f"/users/{i}", network__peer__address=f"10.0.0.{i}", client__address="x"))
    metrics.record(span(kind=SpanKind.INTERNAL))  # not an HTTP server/client span: ignored
    (process,) = metrics.collect().processes
    assert [point.count for point in process.points(SERVER_DURATION)] == [50]
    assert process.points(CLIENT_DURATION) == []


def test_one_resource_metrics_per_process_then_the_agent() -> None:
    metrics = http_metrics(RESOURCES)
    for _ in range(3):
        metrics.record(span(pid=1))
    metrics.record(span(pid=2, kind=SpanKind.CLIENT, server__address="db", server__port=5432))
    counters = Counters()
    requests = exporter_for(metrics, counters, [], start=False).collect()

    wire = [ExportMetricsServiceRequest.FromString(request.SerializeToString()) for request in requests]
    resources = [attributes_dict(rm.resource.attributes) for request in wire for rm in request.resource_metrics]
    assert [resource["service.name"] for resource in resources] == ["api", "vllm", "otelbpf"]
    by_service = {res["service.name"]: metric for res, metric in metrics_of(wire) if metric.name.startswith("http.")}
    assert by_service["api"].name == SERVER_DURATION and by_service["vllm"].name == CLIENT_DURATION
    for metric in by_service.values():
        assert metric.unit == "s"
        assert metric.histogram.aggregation_temporality == CUMULATIVE
        (point,) = metric.histogram.data_points
        assert list(point.explicit_bounds) == list(DURATION_BOUNDARIES)
        assert len(point.bucket_counts) == len(DURATION_BOUNDARIES) + 1
        assert point.HasField("min") and point.HasField("max") and point.HasField("sum")
    assert by_service["api"].histogram.data_points[0].count == 3
    assert attributes_dict(by_service["vllm"].histogram.data_points[0].attributes)["server.port"] == 5432


def test_cumulative_across_collections_with_a_stable_start_time() -> None:
    metrics = http_metrics(RESOURCES)
    for _ in range(3):
        metrics.record(span())
    first = encode_metrics(metrics.collect().processes, None, time.time_ns())
    for _ in range(2):
        metrics.record(span(40_000_000))
    time.sleep(0.002)
    second = encode_metrics(metrics.collect().processes, None, time.time_ns())

    (_, before), (_, after) = histogram_points(first, SERVER_DURATION) + histogram_points(second, SERVER_DURATION)
    assert (before.count, after.count) == (3, 5)
    assert after.start_time_unix_nano == before.start_time_unix_nano
    assert before.start_time_unix_nano <= before.time_unix_nano < after.time_unix_nano
    assert after.sum == pytest.approx(3 * 0.002 + 2 * 0.04)
    assert (after.min, after.max) == (0.002, 0.04)


def test_series_beyond_the_limit_fold_into_an_overflow_series_and_are_counted() -> None:
    metrics = http_metrics(RESOURCES, max_series=3)
    counters = Counters()
    for route in ("/a", "/b", "/c", "/d", "/e", "/d"):
        metrics.record(span(http__route=route))
    metrics.record(span(http__route="/a"))  # an existing series still counts past the limit
    requests = exporter_for(metrics, counters, [], start=False).collect()

    points = {
        json.dumps(attributes_dict(point.attributes), sort_keys=True): point.count
        for _, point in histogram_points(requests, SERVER_DURATION)
    }
    assert len(points) == 4
    assert points[json.dumps({"otel.metric.overflow": True})] == 3
    assert sorted(points.values()) == [1, 1, 2, 3]
    assert counters.get("otelbpf.metrics.overflow") == 3
    assert metrics.series_count == 3
    gauges = {m.name: m.gauge.data_points[0].as_int for _, m in metrics_of(requests) if m.HasField("gauge")}
    assert gauges["otelbpf.metrics.series"] == 3


def test_idle_series_expire_and_come_back_with_a_new_start_time() -> None:
    metrics = http_metrics(RESOURCES, series_ttl_s=0.05)
    metrics.record(span())
    (first,) = metrics.collect().processes[0].points(SERVER_DURATION)
    time.sleep(0.08)
    collection = metrics.collect()  # seen unchanged since the last collection for longer than the TTL
    assert collection.processes == [] and collection.expired == 1 and metrics.series_count == 0

    metrics.record(span())
    (again,) = metrics.collect().processes[0].points(SERVER_DURATION)
    assert again.count == 1 and again.start_ns > first.start_ns


def test_a_reused_pid_starts_new_series_under_the_new_process_resource() -> None:
    generation = iter(range(1, 100))
    resources = ProcessResources(describe=lambda pid, _: {"service.name": f"gen{next(generation)}", "process.pid": pid})
    metrics = http_metrics(resources)
    resources.observe(7)
    metrics.record(span(pid=7))
    metrics.record(span(pid=7))
    resources.mark_exited(7)
    resources.observe(7)  # a new process got pid 7
    metrics.record(span(pid=7))

    collection = metrics.collect()
    assert [(p.resource["service.name"], p.points(SERVER_DURATION)[0].count) for p in collection.processes] == [("gen1", 2), ("gen2", 1)]
    assert [p.resource["service.name"] for p in metrics.collect().processes] == ["gen2"]  # the old one, once more only


def test_record_never_raises() -> None:
    metrics = http_metrics(RESOURCES)
    metrics.record(span(http__route=["not", "hashable"]))
    metrics.record(SpanRecord(b"", b"", "x", SpanKind.SERVER, "bad", None, 1, protocol="http1"))  # type: ignore[arg-type]
    metrics.record(span())
    (process,) = metrics.collect().processes
    assert [point.count for point in process.points(SERVER_DURATION)] == [1]


def test_record_cost_per_span() -> None:
    """Hot path: the cost of record() for typical spans (run with -s to see it)."""
    resources = ProcessResources(describe=lambda pid, _: {"service.name": f"svc{pid}", "process.pid": pid})
    metrics = http_metrics(resources)
    spans = [
        span(
            (i * 7919 % 3000) * 1_000_000,
            pid=100 + i % 8,
            kind=SpanKind.SERVER if i % 3 else SpanKind.CLIENT,
            http__route=f"/r/{i % 25}",
            http__response__status_code=503 if i % 10 == 0 else 200,
            url__path=f"/r/{i}",
            server__address="api",
            server__port=8080,
            network__peer__address="10.1.2.3",
            network__peer__port=40000 + i,
            user_agent__original="python-requests/2.31",
            thread__id=12,
        )
        for i in range(2000)
    ]
    record = metrics.record
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for item in spans:
            record(item)
        best = min(best, time.perf_counter() - started)
    per_span_us = best / len(spans) * 1e6
    print(f"\nSpanMetrics.record: {per_span_us:.2f} us/span ({metrics.series_count} series)")
    assert per_span_us < 20  # a liveness bound, not a benchmark: the measured cost is reported above


# --- self-metrics ----------------------------------------------------------------------


def test_self_metrics_are_monotonic_sums_under_the_agent_resource(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "k8s.node.name=node-1,deployment.environment.name=prod")
    counters = Counters()
    counters.add("otelbpf.events", 120)
    counters.add("otelbpf.export.spans", 40, label="otlp")
    counters.add("otelbpf.export.spans", 2, label="jsonfile")
    counters.add("otelbpf.export.dropped", 1, label="otlp")
    counters.add("otelbpf.exchanges.incomplete", 3, label="connection_closed")
    counters.add("otelbpf.parse.errors", 4, label="http1")
    counters.add("otelbpf.some.future.counter", 5, label="x")

    def broken() -> int:
        raise RuntimeError("gone")

    exporter = MetricsExporter(
        None,
        counters,
        agent_resource_attributes(),
        [],
        interval_s=3600,
        gauges={"otelbpf.connections.open": lambda: 17, "otelbpf.broken": broken},
        start=False,
    )
    requests = exporter.collect()

    (resource_metrics,) = [rm for request in requests for rm in request.resource_metrics]
    resource = attributes_dict(resource_metrics.resource.attributes)
    assert resource["service.name"] == "otelbpf"
    assert resource["service.version"] == otelbpf.__version__
    assert resource["process.pid"] == os.getpid()
    assert resource["host.name"] == socket.gethostname()
    assert resource["k8s.node.name"] == "node-1" and resource["deployment.environment.name"] == "prod"
    assert resource["service.instance.id"]

    sums = sums_by_name(requests)
    for metric in sums.values():
        assert metric.sum.is_monotonic and metric.sum.aggregation_temporality == CUMULATIVE
        assert metric.unit.startswith("{") or metric.unit == "1"
    assert sums["otelbpf.events"].description == "events received from the source"
    assert sums["otelbpf.events"].unit == "{event}"
    assert sums["otelbpf.export.spans"].unit == "{span}"

    def values(name: str) -> dict[str, int]:
        return {
            json.dumps(attributes_dict(point.attributes), sort_keys=True): point.as_int
            for point in sums[name].sum.data_points
        }

    assert values("otelbpf.events") == {"{}": 120}
    assert values("otelbpf.export.spans") == {'{"sink": "jsonfile"}': 2, '{"sink": "otlp"}': 40}
    assert values("otelbpf.export.dropped") == {'{"sink": "otlp"}': 1}
    assert values("otelbpf.exchanges.incomplete") == {'{"reason": "connection_closed"}': 3}
    assert values("otelbpf.parse.errors") == {'{"protocol": "http1"}': 4}
    assert values("otelbpf.some.future.counter") == {'{"label": "x"}': 5}
    starts = {point.start_time_unix_nano for metric in sums.values() for point in metric.sum.data_points}
    assert len(starts) == 1

    gauges = {metric.name: metric for _, metric in metrics_of(requests) if metric.HasField("gauge")}
    assert set(gauges) == {"otelbpf.connections.open"}  # the broken one is skipped
    assert gauges["otelbpf.connections.open"].gauge.data_points[0].as_int == 17
    assert gauges["otelbpf.connections.open"].unit == "{connection}"

    counters.add("otelbpf.events", 5)
    assert values_after(exporter, "otelbpf.events") == [125]  # cumulative: same start, growing value


def values_after(exporter: MetricsExporter, name: str) -> list[int]:
    return [point.as_int for point in sums_by_name(exporter.collect())[name].sum.data_points]


def test_large_collections_are_split_repeating_the_headers() -> None:
    metrics = http_metrics(RESOURCES)
    for route in range(25):
        metrics.record(span(pid=1 + route % 2, http__route=f"/r{route}"))
    collection = metrics.collect()
    requests = encode_metrics(collection.processes, None, time.time_ns(), max_points=10)

    assert len(requests) == 3
    for request in requests:
        points = [
            p for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
            for p in m.histogram.data_points
        ]  # fmt: skip
        assert 1 <= len(points) <= 10
        for rm in request.resource_metrics:
            assert attributes_dict(rm.resource.attributes)["service.name"] in ("api", "vllm")
            assert all(m.name == SERVER_DURATION and m.unit == "s" for sm in rm.scope_metrics for m in sm.metrics)
    assert recorded_count(requests) == 25
    assert encode_metrics([], None, time.time_ns()) == []


# --- export ----------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_export_to_a_receiver_counts_every_span(otlp_receiver: OtlpReceiver, protocol: str) -> None:
    endpoint = otlp_receiver.grpc_endpoint if protocol == "grpc" else otlp_receiver.http_endpoint
    metrics = http_metrics(RESOURCES)
    counters = Counters()
    exporter = exporter_for(metrics, counters, [make_otlp_metric_sink(endpoint, protocol)])
    for i in range(30):
        kind = SpanKind.SERVER if i % 3 else SpanKind.CLIENT
        metrics.record(span(pid=1 + i % 2, kind=kind, http__route=f"/r{i % 4}"))

    assert exporter.force_flush(10) is True
    for _ in range(12):
        metrics.record(span())
    exporter.shutdown(5)

    first, last = otlp_receiver.wait_for_metric_requests(2)
    assert recorded_count([first]) == 30
    assert recorded_count([last]) == 42  # cumulative
    services = {res["service.name"] for res, _ in metrics_of([last])}
    assert services == {"api", "vllm", "otelbpf"}
    assert counters.get("otelbpf.metrics.exports", "otlp-metrics") == 2
    assert counters.get("otelbpf.metrics.export.failures") == 0
    exported = sums_by_name([last])["otelbpf.metrics.exports"].sum.data_points
    assert [(attributes_dict(p.attributes), p.as_int) for p in exported] == [({"sink": "otlp-metrics"}, 1)]


@pytest.mark.parametrize("suffix", ["", "/", "/v1/metrics", "/v1/traces"])
def test_http_sink_accepts_a_base_metrics_or_traces_url(otlp_receiver: OtlpReceiver, suffix: str) -> None:
    sink = OtlpHttpSink(METRICS, otlp_receiver.http_endpoint + suffix)
    request = exporter_for(None, some_counters(), [], start=False).collect()[0]
    assert sink.export(request) is True
    sink.shutdown()
    assert otlp_receiver.wait_for_metric_requests(1)[0] == request


def test_metrics_url() -> None:
    assert metrics_url("http://c:4318") == "http://c:4318/v1/metrics"
    assert metrics_url("https://c:4318/prefix/") == "https://c:4318/prefix/v1/metrics"
    assert metrics_url("http://c:4318/v1/metrics") == "http://c:4318/v1/metrics"
    assert metrics_url("http://c:4318/p/v1/traces") == "http://c:4318/p/v1/metrics"
    with pytest.raises(ValueError, match="http:// or https://"):
        metrics_url("c:4318")


def test_protocol_from_argument_then_metrics_env_then_generic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_metrics_protocol() == "grpc"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    assert resolve_metrics_protocol() == "http/protobuf"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc")
    assert resolve_metrics_protocol() == "grpc"
    assert resolve_metrics_protocol("HTTP/Protobuf") == "http/protobuf"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/json")
    with pytest.raises(ValueError, match=r"'http/json'.*OTEL_EXPORTER_OTLP_METRICS_PROTOCOL.*grpc, http/protobuf"):
        make_otlp_metric_sink()


def test_env_selects_http_metrics_endpoint_from_the_base_endpoint(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_receiver.http_endpoint)  # base: /v1/metrics appended
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "gzip")
    sink = make_otlp_metric_sink()
    assert isinstance(sink, OtlpHttpSink)
    request = exporter_for(None, some_counters(), [], start=False).collect()[0]
    assert sink.export(request) is True
    sink.shutdown()
    assert otlp_receiver.wait_for_metric_requests(1)[0] == request


def test_env_metrics_endpoint_wins_for_grpc(otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", otlp_receiver.grpc_endpoint)
    sink = make_otlp_metric_sink(timeout_s=5)
    assert isinstance(sink, OtlpGrpcSink)
    request = exporter_for(None, some_counters(), [], start=False).collect()[0]
    assert sink.export(request) is True
    sink.shutdown()
    assert otlp_receiver.wait_for_metric_requests(1)[0] == request


def test_export_interval_from_argument_then_env(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_interval() == 60.0
    assert resolve_interval(2.5) == 2.5
    with pytest.raises(ValueError):
        resolve_interval(0)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "bogus")
    assert resolve_interval() == 60.0
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "100")  # milliseconds
    assert resolve_interval() == 0.1

    exporter = MetricsExporter(None, some_counters(), None, [OtlpGrpcSink(METRICS, otlp_receiver.grpc_endpoint)])
    try:
        assert exporter.interval_s == 0.1
        assert len(otlp_receiver.wait_for_metric_requests(3, timeout=5)) >= 3  # on its own, on the interval
    finally:
        exporter.shutdown(5)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_collector_that_is_down_fails_the_export_without_hanging_shutdown(protocol: str) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens
    counters = Counters()
    metrics = http_metrics(RESOURCES)
    metrics.record(span())
    exporter = exporter_for(metrics, counters, [make_otlp_metric_sink(endpoint, protocol, timeout_s=30)])

    started = time.monotonic()
    exporter.shutdown(timeout_s=1.0)
    elapsed = time.monotonic() - started

    assert elapsed < 2.0
    assert counters.get("otelbpf.metrics.export.failures", "otlp-metrics") == 1
    assert counters.get("otelbpf.metrics.exports") == 0


def test_a_collector_that_never_answers_does_not_hang_shutdown() -> None:
    with socket.socket() as blackhole:  # accepts connections (backlog), never reads or answers
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(8)
        endpoint = f"http://127.0.0.1:{blackhole.getsockname()[1]}"
        counters = some_counters()
        exporter = exporter_for(None, counters, [OtlpHttpSink(METRICS, endpoint, timeout_s=30)])
        started = time.monotonic()
        exporter.shutdown(timeout_s=0.5)
        assert time.monotonic() - started < 1.5
        assert counters.get("otelbpf.metrics.export.failures", "otlp-metrics") == 1


def test_a_slow_sink_does_not_delay_the_others(tmp_path: Any) -> None:
    with socket.socket() as blackhole:
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(8)
        path = tmp_path / "m.json"
        counters = some_counters()
        exporter = exporter_for(
            None,
            counters,
            [
                OtlpHttpSink(METRICS, f"http://127.0.0.1:{blackhole.getsockname()[1]}", timeout_s=30),
                MetricsJsonFileSink(path),
            ],
        )
        for exported in (1, 2):  # the OTLP lane is stuck in its first export meanwhile
            exporter.export_now()
            assert wait_for(lambda: counters.get("otelbpf.metrics.exports", "jsonfile-metrics") == exported)
        exporter.shutdown(0.5)
        assert counters.get("otelbpf.metrics.exports", "jsonfile-metrics") == 3
        # Stuck at the deadline: counted once.
        assert counters.get("otelbpf.metrics.export.failures", "otlp-metrics") == 1
        assert len(read_metrics_json_file(path)) == 3  # two exports and the final one


def wait_for(predicate: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.005)
    return bool(predicate())


def test_json_file_sink_writes_collector_style_otlp_json(tmp_path: Any) -> None:
    path = tmp_path / "otelbpf-traces.metrics.json"
    metrics = http_metrics(RESOURCES)
    metrics.record(span(1_500_000_000))
    counters = Counters()
    counters.add("otelbpf.export.spans", 1, label="jsonfile")
    exporter = exporter_for(metrics, counters, [MetricsJsonFileSink(path)])
    assert exporter.force_flush(5)
    exporter.shutdown(5)

    lines = path.read_text().splitlines()
    assert len(lines) == 2
    document = json.loads(lines[0])
    histogram = document["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0]
    assert histogram["name"] == SERVER_DURATION
    point = histogram["histogram"]["dataPoints"][0]
    assert histogram["histogram"]["aggregationTemporality"] == 2
    assert point["count"] == "1" and isinstance(point["startTimeUnixNano"], str)
    assert point["bucketCounts"][10] == "1" and point["sum"] == 1.5
    requests = read_metrics_json_file(path)
    assert recorded_count(requests) == 2
    assert metrics_json_path("out/otelbpf-traces.json").as_posix() == "out/otelbpf-traces.metrics.json"
    assert metrics_json_path("spans").as_posix() == "spans.metrics.json"


def test_collections_taken_while_recording_are_consistent() -> None:
    metrics = http_metrics(RESOURCES)
    total = 20_000
    done = threading.Event()

    def produce() -> None:
        for i in range(total):
            metrics.record(span((i % 400) * 1_000_000, http__route=f"/r{i % 3}"))
        done.set()

    producer = threading.Thread(target=produce)
    producer.start()
    snapshots = 0
    while not done.is_set() or snapshots == 0:
        for process in metrics.collect().processes:
            for point in process.points(SERVER_DURATION):
                assert point.count == sum(point.bucket_counts)
        snapshots += 1
    producer.join()
    (process,) = metrics.collect().processes
    assert sum(point.count for point in process.points(SERVER_DURATION)) == total


def test_attribute_strings_that_are_not_valid_utf8_are_coerced_when_encoding() -> None:
    metrics = http_metrics(StaticResources({1: {"service.name": "bad\udcffname"}}))
    metrics.record(span(http__route="/caf\udce9"))
    (request,) = encode_metrics(metrics.collect().processes, None, time.time_ns())
    wire = ExportMetricsServiceRequest.FromString(request.SerializeToString())
    ((resource, point),) = histogram_points([wire], SERVER_DURATION)
    assert attributes_dict(point.attributes)["http.route"] == "/caf\ufffd"
    assert resource["service.name"] == "bad\ufffdname"


def test_replayed_capture_metrics_count_exactly_the_spans_exported(otlp_receiver: OtlpReceiver) -> None:
    """The real pipeline on a real capture, spans and metrics to one receiver through MeteredProcessor."""
    from otelbpf.cli.main import replay_attributes
    from otelbpf.export import BatchSpanProcessor
    from otelbpf.otlp import TRACES
    from otelbpf.pipeline import Pipeline
    from otelbpf.sources.pcap import PcapSource

    counters = Counters()
    source = PcapSource(str(DATA / "http_get.pcap"), perspective="both")
    resources = ProcessResources(describe=lambda pid, _comm: replay_attributes(source, pid))
    processor = BatchSpanProcessor([OtlpGrpcSink(TRACES, otlp_receiver.grpc_endpoint)], resources, counters)
    span_metrics = SpanMetrics(resources, default_instruments())
    metric_sink = OtlpGrpcSink(METRICS, otlp_receiver.grpc_endpoint)
    exporter = MetricsExporter(span_metrics, counters, agent_resource_attributes(), [metric_sink])
    consumer = MeteredProcessor(processor, span_metrics, exporter)
    pipeline = Pipeline(consumer, resources, counters)
    exporter.add_gauge("otelbpf.connections.open", lambda: len(pipeline.table))

    pipeline.handle(list(source.events()))
    pipeline.finish()
    consumer.shutdown(10)

    spans = otlp_receiver.wait_for_spans(1)
    (final,) = otlp_receiver.wait_for_metric_requests(1)
    assert recorded_count([final]) == len(spans) == counters.get("otelbpf.spans.created") == 4  # 2 exchanges x 2 sides
    by_kind = {
        (res["service.name"], name): sorted(
            attributes_dict(p.attributes).get("http.response.status_code") for p in points
        )
        for name in (SERVER_DURATION, CLIENT_DURATION)
        for res, points in _group(histogram_points([final], name))
    }
    assert sorted(by_kind.values()) == [[200, 404], [200, 404]]
    sums = sums_by_name([final])
    assert [p.as_int for p in sums["otelbpf.spans.created"].sum.data_points] == [4]
    assert [(attributes_dict(p.attributes), p.as_int) for p in sums["otelbpf.export.spans"].sum.data_points] == [
        ({"sink": "otlp"}, 4)
    ]
    gauges = {metric.name for _, metric in metrics_of([final]) if metric.HasField("gauge")}
    assert gauges == {"otelbpf.connections.open", "otelbpf.metrics.series"}


def _group(points: list[tuple[dict[str, Any], Any]]) -> list[tuple[dict[str, Any], list[Any]]]:
    groups: dict[str, tuple[dict[str, Any], list[Any]]] = {}
    for resource, point in points:
        groups.setdefault(json.dumps(resource, sort_keys=True), (resource, []))[1].append(point)
    return list(groups.values())


def test_an_exporter_never_started_still_exports_at_shutdown(tmp_path: Any) -> None:
    path = tmp_path / "m.json"
    exporter = exporter_for(None, some_counters(), [MetricsJsonFileSink(path)], start=False)
    exporter.shutdown(5)
    assert len(read_metrics_json_file(path)) == 1
    exporter.shutdown(5)  # idempotent


# --- instruments as data ------------------------------------------------------------------


def test_spans_of_a_protocol_without_instruments_are_not_measured() -> None:
    metrics = http_metrics(RESOURCES)
    grpc_span = span()
    grpc_span.protocol = "grpc"  # an RPC must never land in http.server.request.duration
    unknown = span()
    unknown.protocol = ""
    metrics.record(grpc_span)
    metrics.record(unknown)
    assert metrics.collect().processes == [] and metrics.series_count == 0


def test_an_instrument_s_required_attribute_keeps_other_spans_from_its_selector() -> None:
    offered: list[SpanRecord] = []

    def select(span: SpanRecord) -> bool:
        offered.append(span)
        return True

    streamed = SpanHistogram(
        name="stream.chunks",
        unit="{chunk}",
        description="Chunks per streamed response.",
        boundaries=(1.0, 10.0),
        attributes=(),
        select=select,
        value=lambda s: float(s.attributes["chunks"]),
        requires="chunks",
    )
    metrics = SpanMetrics(RESOURCES, {"http1": HTTP1_INSTRUMENTS + (streamed,)})
    plain, with_chunks = span(), span(chunks=5)
    metrics.record(plain)
    metrics.record(with_chunks)

    assert offered == [with_chunks]
    (process,) = metrics.collect().processes
    (point,) = process.points("stream.chunks")
    assert (point.count, point.sum) == (1, 5.0)
    assert process.points(SERVER_DURATION)[0].count == 2  # instruments without a requirement see every span


def test_any_protocol_s_instruments_are_aggregated_and_encoded_from_their_definition() -> None:
    sizes = SpanHistogram(
        name="rpc.server.request.size",
        unit="By",
        description="Request sizes.",
        boundaries=(10.0, 100.0),
        attributes=("rpc.method",),
        select=of_kind(SpanKind.SERVER),
        value=lambda s: float(s.attributes["size"]),
    )
    metrics = SpanMetrics(RESOURCES, {"http1": HTTP1_INSTRUMENTS, "rpc": (sizes,)})
    for size in (5, 50, 500, 50):
        rpc = span(rpc__method="Get", size=size)
        rpc.protocol = "rpc"
        metrics.record(rpc)
    metrics.record(span(kind=SpanKind.CLIENT, rpc__method="Get", size=1))  # http1: http.client only

    (process,) = metrics.collect().processes
    assert [instrument.name for instrument, _ in process.histograms] == [CLIENT_DURATION, "rpc.server.request.size"]
    (point,) = process.points("rpc.server.request.size")
    assert point.attributes == {"rpc.method": "Get"}
    assert (point.count, point.sum, point.bucket_counts) == (4, 605.0, (1, 2, 1))

    (request,) = encode_metrics([process], None, time.time_ns())
    by_name = {metric.name: metric for _, metric in metrics_of([request])}
    encoded = by_name["rpc.server.request.size"]
    assert (encoded.unit, encoded.description) == ("By", "Request sizes.")
    assert list(encoded.histogram.data_points[0].explicit_bounds) == [10.0, 100.0]
    assert list(by_name[CLIENT_DURATION].histogram.data_points[0].explicit_bounds) == list(DURATION_BOUNDARIES)


def test_the_profiles_signal_url_replaces_another_signal_s_path() -> None:
    assert signal_url("http://c:4318", PROFILES) == "http://c:4318/v1development/profiles"
    assert signal_url("http://c:4318/p/v1/traces", PROFILES) == "http://c:4318/p/v1development/profiles"


def test_per_process_sums_are_cumulative_monotonic_under_each_process_resource() -> None:
    """MetricsExporter.add_process_sums (GPU kernel launches): a Sum per process, started when
    the agent started, beside the gauges, merged into the process's Resource."""
    exporter = MetricsExporter(None, Counters(), {"service.name": "otelbpf"}, [], interval_s=60, start=False)
    totals = {7: 3}
    exporter.add_process_sums(
        lambda: {pid: [("x.launches", "Launches.", "{launch}", n)] for pid, n in totals.items()},
        lambda pid: {"process.pid": pid},
    )
    exporter.add_process_gauges(lambda: {7: [("x.reserved", "Reserved.", "By", 10)]}, lambda pid: {"process.pid": pid})
    first = {(r.get("process.pid"), m.name): m for r, m in metrics_of(exporter.collect())}
    totals[7] = 5
    second = {(r.get("process.pid"), m.name): m for r, m in metrics_of(exporter.collect())}
    launches = second[(7, "x.launches")]
    assert launches.sum.is_monotonic and launches.sum.aggregation_temporality == AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
    assert first[(7, "x.launches")].sum.data_points[0].as_int == 3 and launches.sum.data_points[0].as_int == 5
    point = launches.sum.data_points[0]
    assert 0 < point.start_time_unix_nano < point.time_unix_nano
    assert launches.unit == "{launch}" and second[(7, "x.reserved")].gauge.data_points[0].as_int == 10


def test_instruments_are_chosen_by_kind_exactly_as_their_selectors_would() -> None:
    """SpanMetrics sorts of_kind instruments by kind once; spans of every kind, odd ones
    included (an int that is no SpanKind, a bool, an unhashable value, a non-dict attributes
    mapping), land in the instruments whose selectors accept them, and record never raises."""
    any_kind = SpanHistogram(
        name="any.duration", unit="s", description="Every span.", boundaries=(1.0,),
        attributes=("http.request.method",), select=lambda s: True,
    )  # fmt: skip
    instruments = (*HTTP1_INSTRUMENTS, any_kind)
    metrics = SpanMetrics(RESOURCES, {"http1": instruments})
    kinds: list[Any] = [*SpanKind, 9, True, 2.0, [2]]
    for kind in kinds:
        metrics.record(span(kind=kind))
    odd_mapping = span(kind=SpanKind.CLIENT)
    odd_mapping.attributes = MappingProxyType(dict(odd_mapping.attributes))
    metrics.record(odd_mapping)

    def expected(instrument: SpanHistogram) -> int:
        return sum(1 for kind in kinds if instrument.select(span(kind=kind))) + bool(instrument.select(odd_mapping))

    (process,) = metrics.collect().processes
    for instrument in instruments:
        assert sum(point.count for point in process.points(instrument.name)) == expected(instrument), instrument.name
    assert expected(any_kind) == len(kinds) + 1 and process.points(CLIENT_DURATION)[0].attributes[
        "http.request.method"
    ] == "GET"
