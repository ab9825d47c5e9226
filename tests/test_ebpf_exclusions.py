"""No self-tracing: `run --all` never exports spans of its own export
traffic, and --exclude-comm / --exclude-pid drop processes in the kernel."""

from __future__ import annotations

import subprocess
import time

import pytest
from conftest import EXAMPLES
from otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.ebpf


def curl(port: int, path: str) -> None:
    subprocess.run(["curl", "-sf", "-o", "/dev/null", f"http://127.0.0.1:{port}{path}"], check=True)


def export_spans(spans, receiver_port: int) -> list:
    """Spans of the OTLP/HTTP export traffic: either end on the receiver's port."""
    return [
        s
        for s in spans
        if receiver_port in (s.attributes.get("server.port"), s.attributes.get("client.port"))
        or str(s.attributes.get("url.path", "")).startswith("/v1/")
    ]


def traced_all(agent, services, extra: list[str]) -> tuple[list, int, dict]:
    """--all with OTLP/HTTP to a local receiver, requests to a backend for 4 s
    (several export rounds): every span received, the receiver's port, stats."""
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0"])
    with OtlpReceiver(grpc_port=None) as receiver:
        run = agent(
            ["--all", "--otlp-protocol", "http/protobuf", "--otlp-endpoint", receiver.http_endpoint, *extra],
            env={"OTEL_METRICS_EXPORTER": "none"},
        )
        deadline = time.monotonic() + 4
        i = 0
        while time.monotonic() < deadline:
            curl(backend.port, f"/items/{i}")
            i += 1
            time.sleep(0.2)
        receiver.wait_for_spans(1, timeout=20)
        time.sleep(1.5)  # the export of the last batch, traced or not
        assert run.stop() == 0, run.output
        port = int(receiver.http_endpoint.rsplit(":", 1)[1].split("/")[0])
        return receiver.spans(), port, run.stats()


def test_all_exports_no_span_of_its_own_export_traffic(agent, services):
    spans, port, stats = traced_all(agent, services, [])
    assert any(s.attributes.get("url.path", "").startswith("/items/") for s in spans)
    assert export_spans(spans, port) == []
    assert stats.get("otelbpf.connections.excluded", 0) >= 1


def test_without_default_excludes_the_export_traffic_is_traced(agent, services):
    """The control: the feedback loop the default list prevents is real."""
    spans, port, _ = traced_all(agent, services, ["--no-default-excludes"])
    assert export_spans(spans, port), "expected the receiver's POST /v1/traces among the spans"


def test_exclude_comm_and_pid_drop_processes_in_the_kernel(agent, services, tmp_path):
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0"])
    other = services([str(EXAMPLES / "http_backend.py"), "--port", "0"])
    out = tmp_path / "spans.json"
    run = agent(["--all", "--exclude-comm", "cur*", "--exclude-pid", str(other.pid), "--json-file", str(out)])
    for i in range(3):
        curl(backend.port, f"/items/{i}")
        curl(other.port, f"/items/{i}")
    time.sleep(1)
    assert run.stop() == 0, run.output
    import json

    resources = []
    for line in out.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            attrs = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
            resources.append((attrs, [s["name"] for ss in rs["scopeSpans"] for s in ss["spans"]]))
    pids = {int(a["process.pid"]["intValue"]) for a, _ in resources}
    names = {a["process.executable.name"]["stringValue"] for a, _ in resources}
    assert backend.pid in pids  # its server spans
    assert other.pid not in pids  # --exclude-pid
    assert "curl" not in names  # --exclude-comm cur*: no client spans from curl
