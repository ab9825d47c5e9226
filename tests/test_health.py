"""The health and self-metrics port (`run --health-port`): what the Helm
chart's probes and ServiceMonitor read, from the real agent."""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request

import pytest
from otlp_receiver import free_port

from conftest import EXAMPLES
from otelbpf.core.selfmetrics import Counters
from otelbpf.metrics.selfmetrics import label_key
from otelbpf.runtime.health import prometheus_text


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_counters_in_prometheus_text_format():
    counters = Counters()
    counters.add("otelbpf.events", 7)
    counters.add("otelbpf.export.spans", 3, label='otlp "main"')
    text = prometheus_text(counters, label_key)
    assert "# TYPE otelbpf_events_total counter\notelbpf_events_total 7\n" in text
    assert 'otelbpf_export_spans_total{sink="otlp \\"main\\""} 3' in text


@pytest.mark.ebpf
def test_agent_serves_health_readiness_and_metrics(agent, services):
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0"])
    port = free_port()
    run = agent(["--pid", str(backend.pid), "--health-port", str(port), "--json-file", "/dev/null"])
    subprocess.run(["curl", "-sf", "-o", "/dev/null", f"http://127.0.0.1:{backend.port}/items/1"], check=True)
    assert get(port, "/healthz") == (200, "ok\n")
    assert get(port, "/readyz") == (200, "ready\n")
    status, body = get(port, "/metrics")
    assert status == 200 and "otelbpf_events_total " in body
    assert get(port, "/nothing")[0] == 404
    assert run.stop() == 0
