"""The real agent exporting OTLP to a receiver that decodes the official protobufs."""

from __future__ import annotations

import subprocess
import time

import pytest
from conftest import EXAMPLES
from otlp_receiver import OtlpReceiver, free_port

pytestmark = pytest.mark.ebpf


def curl(port: int, path: str) -> None:
    subprocess.run(["curl", "-sf", "-o", "/dev/null", f"http://127.0.0.1:{port}{path}"], check=True)


def test_grpc_export_with_resources_from_process_and_agent_env(services, agent):
    backend = services(
        [str(EXAMPLES / "http_backend.py"), "--port", "0", "--delay-ms", "1"],
        env={"OTEL_SERVICE_NAME": "inventory", "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=staging"},
    )
    with OtlpReceiver(http_port=None) as receiver:
        run = agent(
            ["--pid", str(backend.pid), "--otlp-endpoint", receiver.grpc_endpoint],
            env={"OTEL_RESOURCE_ATTRIBUTES": "k8s.node.name=node-7"},
        )
        for i in range(5):
            curl(backend.port, f"/items/{i}")
        spans = receiver.wait_for_spans(5, timeout=20)
        assert run.stop() == 0
    assert len(spans) == 5
    resource = spans[0].resource
    assert resource["service.name"] == "inventory"  # the traced process's own OTEL_SERVICE_NAME
    assert resource["deployment.environment.name"] == "staging"
    assert resource["k8s.node.name"] == "node-7"  # the agent's OTEL_RESOURCE_ATTRIBUTES
    assert resource["process.pid"] == backend.pid
    assert resource["host.name"]
    assert sorted(s.attributes["url.path"] for s in spans) == [f"/items/{i}" for i in range(5)]
    assert {s.scope for s in spans} == {"otelbpf.http1"}


def test_http_protobuf_export_configured_by_standard_env_vars(services, agent):
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0", "--delay-ms", "1"])
    with OtlpReceiver(grpc_port=None) as receiver:
        run = agent(
            ["--pid", str(backend.pid)],
            env={
                "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=team-a",
            },
        )
        for i in range(3):
            curl(backend.port, f"/items/{i}")
        spans = receiver.wait_for_spans(3, timeout=20)
        assert run.stop() == 0
        assert receiver.trace_headers and all(h.get("x-tenant") == "team-a" for h in receiver.trace_headers)
    assert len(spans) == 3


def test_collector_that_comes_up_late_loses_nothing(services, agent):
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0", "--delay-ms", "1"])
    port = free_port()
    run = agent(["--pid", str(backend.pid), "--otlp-endpoint", f"http://127.0.0.1:{port}"])
    for i in range(30):
        curl(backend.port, f"/items/{i}")
    time.sleep(3)  # the agent tries, fails and keeps the spans queued
    assert run.proc.poll() is None
    with OtlpReceiver(grpc_port=port, http_port=None) as receiver:
        spans = receiver.wait_for_spans(30, timeout=60)
        assert run.stop() == 0
    paths = [s.attributes["url.path"] for s in spans]
    assert sorted(paths) == sorted(f"/items/{i}" for i in range(30))  # all of them, none twice
    assert run.stats().get("otelbpf.export.dropped{otlp}", 0) == 0


def test_collector_that_never_comes_up_does_not_hang_the_agent(services, agent):
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0", "--delay-ms", "1"])
    run = agent(["--pid", str(backend.pid), "--otlp-endpoint", f"http://127.0.0.1:{free_port()}"])
    for i in range(4):
        curl(backend.port, f"/items/{i}")
    time.sleep(1)
    started = time.monotonic()
    assert run.stop() == 0
    assert time.monotonic() - started < 30  # flush timeout + probe detach, never a hang
    assert run.stats()["otelbpf.export.dropped{otlp}"] == 4  # the loss is counted, not silent


def _histogram_points(requests, metric_name: str, pid: int):
    points = []
    for request in requests:
        for resource_metrics in request.resource_metrics:
            attrs = {kv.key: kv.value for kv in resource_metrics.resource.attributes}
            if attrs.get("process.pid") is None or attrs["process.pid"].int_value != pid:
                continue
            for scope in resource_metrics.scope_metrics:
                points += [(request, p) for m in scope.metrics if m.name == metric_name for p in m.histogram.data_points]
    return points


def _sum_value(request, metric_name: str) -> int:
    total = 0
    for resource_metrics in request.resource_metrics:
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                if metric.name == metric_name:
                    total += sum(p.as_int for p in metric.sum.data_points)
    return total


def test_http_duration_metrics_count_every_request(services, agent):
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0", "--delay-ms", "1"])
    gateway = services([str(EXAMPLES / "http_gateway.py"), "--port", "0", "--backend", f"127.0.0.1:{backend.port}"])
    with OtlpReceiver(http_port=None) as receiver:
        run = agent(
            ["--pid", str(backend.pid), "--pid", str(gateway.pid), "--otlp-endpoint", receiver.grpc_endpoint, "--metrics-interval", "1"]
        )
        for i in range(12):
            curl(gateway.port, f"/api/items/{i}")
        subprocess.run(["curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{gateway.port}/api/error"], check=True)
        receiver.wait_for_spans(39, timeout=20)
        assert run.stop() == 0
        final = receiver.metric_requests[-1]  # cumulative: the last export has every request
    server_points = _histogram_points([final], "http.server.request.duration", backend.pid)
    by_status = {}
    for _, point in server_points:
        attrs = {kv.key: kv.value for kv in point.attributes}
        by_status[attrs["http.response.status_code"].int_value] = point
        assert attrs["http.request.method"].string_value == "GET"
        assert "url.path" not in attrs  # high-cardinality attributes stay on spans
        assert list(point.explicit_bounds) == [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10]
    assert by_status[200].count == 12 and by_status[500].count == 1
    assert sum(by_status[200].bucket_counts) == 12
    client_points = _histogram_points([final], "http.client.request.duration", gateway.pid)
    assert sum(point.count for _, point in client_points) == 13
    gateway_server = _histogram_points([final], "http.server.request.duration", gateway.pid)
    assert sum(point.count for _, point in gateway_server) == 13
    # the agent's own counters, under its own resource
    assert _sum_value(final, "otelbpf.spans.created") == 39
    assert _sum_value(final, "otelbpf.events.lost") == 0
