"""Run a packet capture through the agent's pipeline, in-process.

``otelbpf replay`` and the golden tests (tests/test_golden.py) both use this:
the pcap source's events go through the same :class:`~otelbpf.pipeline.Pipeline`
the eBPF agent runs, in batches, and every span the pipeline ends goes to a
consumer.
"""

from __future__ import annotations

from os import PathLike

from otelbpf.assembly import build_pipeline
from otelbpf.core.model import SpanRecord
from otelbpf.core.selfmetrics import Counters
from otelbpf.host.resources import ProcessResources
from otelbpf.pipeline import Pipeline, SpanConsumer
from otelbpf.semantics import SpanOptions
from otelbpf.sources.pcap import PcapSource, Perspective

BATCH_SIZE = 1024


def replay_resources(source: PcapSource) -> ProcessResources:
    """Resources for the capture's synthetic processes (named after their
    endpoints, see :class:`~otelbpf.sources.pcap.Endpoint`), not /proc."""
    return ProcessResources(describe=lambda pid, _comm: replay_attributes(source, pid))


def replay_attributes(source: PcapSource, pid: int) -> dict:
    endpoint = source.endpoints.get(pid)
    if endpoint is None:
        return {"service.name": f"pcap-endpoint-{pid}"}
    return {"service.name": endpoint.service_name, "otelbpf.source": "pcap"}


def run_replay(
    source: PcapSource,
    consumer: SpanConsumer,
    resources: ProcessResources,
    counters: Counters,
    privacy: SpanOptions | None = None,
    fast_path: bool = False,
) -> Pipeline:
    """Feed every event of ``source`` to a new pipeline, then finish it (open
    exchanges end at the last event). Returns the pipeline. A
    :class:`~otelbpf.sources.pcap.PcapError` midway (a corrupt record)
    propagates after the events before it were handled and the pipeline
    finished. ``fast_path``: HTTP/1 on the compiled fast path (the differential tests)."""
    # the live agent's pipeline, GenAI spans included; no GPU feature: a capture has no library calls
    pipeline = build_pipeline(consumer, resources, counters, options=privacy, fast_path=fast_path, gpu_options=None)
    batch: list = []
    try:
        for event in source.events():
            batch.append(event)
            if len(batch) >= BATCH_SIZE:
                pipeline.handle(batch)
                batch = []
    finally:
        pipeline.handle(batch)
        pipeline.finish()
    return pipeline


class _Collect:
    def __init__(self) -> None:
        self.spans: list[SpanRecord] = []

    def on_end(self, span: SpanRecord) -> None:
        self.spans.append(span)


def replay_spans(
    path: str | PathLike[str],
    perspective: Perspective = "server",
    privacy: SpanOptions | None = None,
    fast_path: bool = False,
    counters: Counters | None = None,
) -> tuple[list[SpanRecord], PcapSource]:
    """Replay the capture at ``path`` and return the spans, in the order the
    pipeline ended them, with the source (its ``endpoints`` name each span's
    ``pid``; its ``stats`` count what was read)."""
    source = PcapSource(path, perspective=perspective)
    collected = _Collect()
    run_replay(source, collected, replay_resources(source), counters or Counters(), privacy, fast_path)
    return collected.spans, source
