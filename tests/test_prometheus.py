"""Every exported metric for Prometheus (otelbpf/metrics/prometheus.py): OpenTelemetry's
Prometheus naming, the exposition Debian's promtool accepts, and the endpoint serving a
collection of the real exporter (span metrics, self-metrics, attributed agent points)."""

from __future__ import annotations

import shutil
import subprocess
import urllib.request

import pytest

from otelbpf.core.model import SpanKind, SpanRecord
from otelbpf.core.selfmetrics import Counters
from otelbpf.host.resources import ProcessResources
from otelbpf.metrics import MetricsExporter, SpanMetrics
from otelbpf.metrics.encode import encode_metrics
from otelbpf.metrics.gpu import NCCL_INSTRUMENTS
from otelbpf.metrics.histograms import HistogramPoint, ProcessHistograms
from otelbpf.metrics.prometheus import PrometheusEndpoint, label_name, metric_name, render
from otelbpf.metrics.selfmetrics import AgentMetrics, GaugeMetric, SumMetric
from otelbpf.runtime.health import HealthServer, Heartbeat


@pytest.mark.parametrize(
    "name, unit, kind, expected",
    [
        ("otelbpf.nccl.time", "s", "histogram", "otelbpf_nccl_time_seconds"),
        ("otelbpf.nccl.call.size", "By", "histogram", "otelbpf_nccl_call_size_bytes"),
        ("otelbpf.events", "{event}", "counter", "otelbpf_events_total"),
        ("otelbpf.gpu.kernel.launch.time", "s", "counter", "otelbpf_gpu_kernel_launch_time_seconds_total"),
        ("otelbpf.budget.shed_ratio", "1", "gauge", "otelbpf_budget_shed_ratio"),  # not repeated
        ("system.cpu.utilization", "1", "gauge", "system_cpu_utilization_ratio"),
        ("http.server.request.duration", "s", "histogram", "http_server_request_duration_seconds"),
        ("net.io", "By/s", "gauge", "net_io_bytes_per_second"),
        ("requests", "", "counter", "requests_total"),
        ("already_total", "", "counter", "already_total"),
        ("2xx.count", "{request}", "gauge", "_2xx_count"),
        ("a..b--c", "ms", "gauge", "a_b_c_milliseconds"),
    ],
)
def test_names_follow_opentelemetrys_prometheus_rules(name, unit, kind, expected):
    assert metric_name(name, unit, kind) == expected


def test_label_names():
    assert label_name("otelbpf.nccl.comm_hash") == "otelbpf_nccl_comm_hash"
    assert label_name("host.name") == "host_name" and label_name("9lives") == "key_9lives"


def collection() -> str:
    instrument = next(i for i in NCCL_INSTRUMENTS if i.name == "otelbpf.nccl.time")
    point = HistogramPoint({"otelbpf.nccl.rank": 1, "otelbpf.nccl.state": "collective", "a.b": "x", "a_b": "y"},
                           1, 3, 0.03, 0.001, 0.02, [0] * 6 + [3] + [0] * 9)  # fmt: skip
    process = ProcessHistograms(
        10, {"service.name": "rank", "service.namespace": "train", "service.instance.id": "abc", "host.name": "node-a",
             "process.pid": 10}, [(instrument, [point])],
    )  # fmt: skip
    agent = AgentMetrics(
        {"service.name": "otelbpf", "service.instance.id": "u1", "host.name": "node-a", "k8s.node.name": "n1"}, 1,
        [SumMetric("otelbpf.events", "events received", "{event}", [({}, 5)])],
        [GaugeMetric("otelbpf.connections.open", "open", "{connection}", 2)],
        [SumMetric("otelbpf.nccl.ras.ranks.missing", "missing \\ \"ranks\"\nnow", "{rank}",
                   [({"otelbpf.nccl.comm_hash": 'a"b'}, 1)])],
    )  # fmt: skip
    return render(encode_metrics([process], agent, 5, start_ns=1))


def test_a_collection_as_prometheus_text():
    text = collection()
    lines = text.splitlines()
    assert 'target_info{host_name="node-a",instance="abc",job="train/rank",process_pid="10"} 1' in lines
    assert 'target_info{host_name="node-a",instance="u1",job="otelbpf",k8s_node_name="n1"} 1' in lines
    labels = ('a_b="x;y",host_name="node-a",instance="abc",job="train/rank",otel_scope_name="otelbpf",'
              'otel_scope_version="0.1.0",otelbpf_nccl_rank="1",otelbpf_nccl_state="collective"')  # fmt: skip
    assert "# TYPE otelbpf_nccl_time_seconds histogram" in lines
    buckets = [line for line in lines if line.startswith("otelbpf_nccl_time_seconds_bucket")]
    assert len(buckets) == 16
    assert [line.rsplit(" ", 1)[1] for line in buckets] == ["0"] * 6 + ["3"] * 10  # cumulative
    assert any('le="+Inf"' in line and line.endswith(" 3") for line in buckets)
    assert f"otelbpf_nccl_time_seconds_sum{{{labels}}} 0.03" in lines
    assert f"otelbpf_nccl_time_seconds_count{{{labels}}} 3" in lines
    assert any(line.startswith("otelbpf_events_total{") and line.endswith(" 5") for line in lines)
    assert "# TYPE otelbpf_connections_open gauge" in lines
    assert "# HELP otelbpf_nccl_ras_ranks_missing missing \\\\ \"ranks\"\\nnow" in lines
    assert any('otelbpf_nccl_comm_hash="a\\"b"' in line for line in lines)


def test_promtool_accepts_the_exposition():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian's prometheus package; scripts/install.sh installs it)")
    result = subprocess.run([promtool, "check", "metrics"], input=collection(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_endpoint_serves_a_collection_of_every_metric():
    """A real exporter (no sink: Prometheus pulls) behind the health server's /metrics."""
    counters = Counters()
    resources = ProcessResources(describe=lambda pid, comm: {"service.name": "rank", "service.instance.id": f"p{pid}"})
    span_metrics = SpanMetrics(resources, {"nccl": NCCL_INSTRUMENTS})
    exporter = MetricsExporter(span_metrics, counters, {"service.name": "otelbpf", "service.instance.id": "me"}, [],
                               interval_s=3600, start=False)  # fmt: skip
    exporter.add_agent_points(lambda: [("otelbpf.nccl.ranks", "size", "{rank}", "gauge", [({"otelbpf.nccl.rank": 0}, 4)])])
    counters.add("otelbpf.events", 7)
    span = SpanRecord(b"t" * 16, b"s" * 8, "ncclAllReduce", SpanKind.INTERNAL, 0, 2_000_000, 42,
                      attributes={"otelbpf.nccl.comm_hash": "00000000000000ab", "otelbpf.nccl.sequence": 0,
                                  "otelbpf.nccl.rank": 0, "otelbpf.nccl.nranks": 4, "otelbpf.nccl.operation": "AllReduce"},
                      scope="otelbpf.nccl", protocol="nccl")  # fmt: skip
    span_metrics.record(span)
    server = HealthServer(0, Heartbeat(object()), counters, host="127.0.0.1", metrics_text=PrometheusEndpoint(exporter).text)
    server.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
            assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    finally:
        server.close()
        exporter.shutdown(1.0)
    lines = text.splitlines()
    assert any(line.startswith("otelbpf_nccl_time_seconds_count{") and 'otelbpf_nccl_state="collective"' in line
               and 'instance="p42"' in line and line.endswith(" 1") for line in lines)  # fmt: skip
    assert any(line.startswith("otelbpf_nccl_call_duration_seconds_count{") for line in lines)
    assert any(line.startswith("otelbpf_events_total{") and line.endswith(" 7") for line in lines)
    assert any(line.startswith("otelbpf_nccl_ranks{") and line.endswith(" 4") for line in lines)


def test_without_prometheus_the_health_port_serves_the_self_metrics_as_before():
    counters = Counters()
    counters.add("otelbpf.events", 3)
    server = HealthServer(0, Heartbeat(object()), counters, host="127.0.0.1").start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
    finally:
        server.close()
    assert "otelbpf_events_total 3" in text.splitlines()
