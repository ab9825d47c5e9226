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
    assert {s.scope for s in spans} == {"otelbpf.http"}


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
