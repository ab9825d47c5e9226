"""Where the user-space CPU of one traced request goes, stage by stage.

Runs the workload of ``pipeline_hot_path.py`` (nginx-like keep-alive GET/200,
server side traced) through ever longer prefixes of the agent's chain and
prints the CPU microseconds per request of each, and the difference to the
previous one (the stage's own cost)::

    .venv/bin/python bench/pipeline_stages.py [--requests N] [--rounds R]
    OTELBPF_PURE=1 .venv/bin/python bench/pipeline_stages.py

Stages: HTTP/1 parsers alone; + stitching (Http1Session); + connection table,
association and span building (Pipeline, spans dropped); + RED metrics; +
batch processor and OTLP encoding (the whole chain, as pipeline_hot_path.py).
Figures are process CPU time, medians over rounds; compare builds only in
alternated runs (bench/README.md).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.pipeline_hot_path import REQUEST, RESPONSE, EncodingSink, NoSource, workload  # noqa: E402
from otelbpf.core.selfmetrics import Counters  # noqa: E402
from otelbpf.export import BatchSpanProcessor  # noqa: E402
from otelbpf.host.resources import ProcessResources  # noqa: E402
from otelbpf.metrics import MeteredProcessor, SpanMetrics  # noqa: E402
from otelbpf.registry import default_instruments  # noqa: E402
from otelbpf.assembly import build_pipeline  # noqa: E402
from protocols.base import Direction  # noqa: E402
from protocols.http1 import Http1Session, HttpParser  # noqa: E402


def _cpu(run) -> float:
    gc.collect()
    started = time.process_time()
    run()
    return time.process_time() - started


def parsers(requests: int) -> float:
    # as the agent has them: no body pieces unless an exchange reports progress
    requests_parser = HttpParser("request", body_events=False)
    responses_parser = HttpParser("response", body_events=False)

    def run() -> None:
        ts = 0
        for _ in range(requests):
            ts += 50_000
            requests_parser.feed(REQUEST, ts)
            responses_parser.expect_response_to("GET")
            responses_parser.feed(RESPONSE, ts + 20_000)

    return _cpu(run)


def session(requests: int) -> float:
    stitcher = Http1Session(Direction.INGRESS, progress=False)

    def run() -> None:
        ts = 0
        for _ in range(requests):
            ts += 50_000
            stitcher.feed(Direction.INGRESS, REQUEST, ts)
            stitcher.feed(Direction.EGRESS, RESPONSE, ts + 20_000)

    return _cpu(run)


class _Drop:
    def on_end(self, span) -> None:
        pass


def _resources() -> ProcessResources:
    return ProcessResources(describe=lambda pid, comm: {"service.name": "nginx", "process.pid": pid})


def _through(consumer_of, requests: int, connections: int = 100) -> float:
    counters = Counters()
    resources = _resources()
    consumer, shutdown = consumer_of(resources, counters)
    pipeline = build_pipeline(consumer, resources, counters, source=NoSource())
    opens, batches = workload(requests, connections)
    pipeline.handle(opens)

    def run() -> None:
        for batch in batches:
            pipeline.handle(batch)
        shutdown()

    return _cpu(run)


def pipeline_only(requests: int) -> float:
    return _through(lambda resources, counters: (_Drop(), lambda: None), requests)


def with_metrics(requests: int) -> float:
    def consumer(resources, counters):
        metrics = SpanMetrics(resources, default_instruments())
        return MeteredProcessor(_Drop(), metrics, None), lambda: None

    return _through(consumer, requests)


def whole_chain(requests: int) -> float:
    def consumer(resources, counters):
        processor = BatchSpanProcessor([EncodingSink()], resources, counters)
        metrics = SpanMetrics(resources, default_instruments())
        return MeteredProcessor(processor, metrics, None), processor.shutdown

    return _through(consumer, requests)


STAGES = (
    ("HTTP/1 parsers", parsers),
    ("+ stitching (session)", session),
    ("+ table, association, span", pipeline_only),
    ("+ RED metrics", with_metrics),
    ("+ batching, OTLP encoding", whole_chain),
)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    for _, stage in STAGES:
        stage(1_000)  # warm-up
    figures = {name: [] for name, _ in STAGES}
    for _ in range(args.rounds):  # stages alternate within each round: drift hits all alike
        for name, stage in STAGES:
            figures[name].append(1e6 * stage(args.requests) / args.requests)
    previous = 0.0
    print(f"{args.requests:,} requests x {args.rounds} rounds; CPU us per request (median), and the stage's own share")
    for name, _ in STAGES:
        median = statistics.median(figures[name])
        print(f"  {name:<30} {median:7.2f} us   {median - previous:+7.2f} us")
        previous = median
    return 0


if __name__ == "__main__":
    sys.exit(main())
