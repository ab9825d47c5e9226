"""Why the Prometheus endpoint renders the agent's own collection rather than using the
OpenTelemetry SDK's Prometheus exporter: what each costs per finished span, and per scrape.

The SDK's exporter (opentelemetry-exporter-prometheus) is a MetricReader of an SDK
MeterProvider: every measurement goes through an SDK instrument (``Histogram.record`` with
its attributes) on the hot path, and one MeterProvider has one Resource, where the agent
exports each traced process under its own. This measures, in one process, alternated:

* ``sdk``: an SDK MeterProvider (an in-memory reader: the same aggregation the Prometheus
  reader collects) recording an HTTP server span's duration with its four attributes;
* ``agent``: otelbpf's SpanMetrics recording the same span (what runs today for OTLP);

and the cost of one scrape of the agent's collection (``render`` of ``MetricsExporter.collect``)
for a given number of series. Numbers, not asserts (bench/README.md).

    .venv/bin/python bench/prometheus_choice.py [--spans 200000] [--rounds 5] [--series 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

from otelbpf import semconv as sc
from otelbpf.core.model import SpanKind, SpanRecord
from otelbpf.core.selfmetrics import Counters
from otelbpf.host.resources import ProcessResources
from otelbpf.metrics import MetricsExporter, SpanMetrics
from otelbpf.metrics.prometheus import render
from otelbpf.registry import default_instruments

ATTRIBUTES = {"http.request.method": "GET", "http.response.status_code": 200, "http.route": "/infer",
              "network.protocol.version": "1.1"}  # fmt: skip


def span(i: int) -> SpanRecord:
    return SpanRecord(b"t" * 16, b"s" * 8, "GET", SpanKind.SERVER, 0, 1_000_000 + i % 5000, 4242,
                      attributes=dict(ATTRIBUTES), scope="otelbpf.http1", protocol="http1")  # fmt: skip


def sdk_cost(spans: list[SpanRecord]) -> float:
    reader = InMemoryMetricReader()
    view = View(instrument_name="*", aggregation=ExplicitBucketHistogramAggregation(sc.HTTP_DURATION_BOUNDARIES)
                if hasattr(sc, "HTTP_DURATION_BOUNDARIES") else ExplicitBucketHistogramAggregation())  # fmt: skip
    provider = MeterProvider(metric_readers=[reader], views=[view])
    histogram = provider.get_meter("otelbpf").create_histogram("http.server.request.duration", unit="s")
    started = time.perf_counter()
    for s in spans:
        histogram.record((s.end_ns - s.start_ns) / 1e9, {key: s.attributes[key] for key in ATTRIBUTES})
    elapsed = time.perf_counter() - started
    provider.shutdown()
    return elapsed / len(spans) * 1e9


def agent_cost(spans: list[SpanRecord]) -> float:
    metrics = SpanMetrics(ProcessResources(describe=lambda pid, comm: {"service.name": "bench"}), default_instruments())
    started = time.perf_counter()
    for s in spans:
        metrics.record(s)
    return (time.perf_counter() - started) / len(spans) * 1e9


def scrape_cost(series: int, rounds: int) -> float:
    """ms per scrape of a collection holding ``series`` HTTP histogram series."""
    resources = ProcessResources(describe=lambda pid, comm: {"service.name": f"p{pid}", "service.instance.id": str(pid)})
    metrics = SpanMetrics(resources, default_instruments(), max_series=series * 4)
    for i in range(series):
        s = span(i)
        s.pid = 1000 + i  # one series per process
        metrics.record(s)
    exporter = MetricsExporter(metrics, Counters(), {"service.name": "otelbpf"}, [], interval_s=3600, start=False)
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        render(exporter.collect())
        times.append(time.perf_counter() - started)
    exporter.shutdown(1.0)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--series", type=int, default=2000)
    args = parser.parse_args()
    spans = [span(i) for i in range(args.spans)]
    sdk, agent = [], []
    for _ in range(args.rounds):  # alternated: the machine's drift hits both alike
        sdk.append(sdk_cost(spans))
        agent.append(agent_cost(spans))
    print(f"record one span's duration histogram: SDK instrument {min(sdk):.0f} ns (median {statistics.median(sdk):.0f}),"
          f" otelbpf SpanMetrics {min(agent):.0f} ns (median {statistics.median(agent):.0f}); best of {args.rounds},"
          f" {args.spans} spans")  # fmt: skip
    print(f"one scrape (collect + render) of {args.series} histogram series: {scrape_cost(args.series, args.rounds):.1f} ms")


if __name__ == "__main__":
    main()
