"""RTPS through the pipeline: datagram events in, messaging spans and DDS metrics out."""

from __future__ import annotations

import os
import socket

from otelbpf.core.events import DatagramEvent
from otelbpf.core.model import SpanKind
from otelbpf.core.selfmetrics import Counters
from otelbpf.host.resources import ProcessResources
from otelbpf.metrics.histograms import SpanMetrics
from otelbpf.pipeline import Pipeline
from otelbpf.registry import default_registry
from protocols.base import Direction
from protocols.rtps.tests import build

A, B, W = build.PREFIX_A, build.PREFIX_B, build.USER_WRITER


class Collect:
    def __init__(self) -> None:
        self.spans = []

    def on_end(self, span) -> None:
        self.spans.append(span)


def datagram(pid, fd, direction, data, ts, peer_port):
    return DatagramEvent(ts, pid, pid, fd, pid * 100 + fd, direction, len(data), data, "127.0.0.1", peer_port, socket.AF_INET)


def run(events):
    collected = Collect()
    pipeline = Pipeline(collected, ProcessResources(describe=lambda pid, comm: {}), Counters(), registry=default_registry())
    pipeline.handle(events)
    pipeline.finish()
    return collected.spans


def test_sent_and_received_samples_are_linked_messaging_spans():
    announce = build.announce_writer(A, W, "rt/chatter", "std_msgs::msg::dds_::String_")
    reader = build.announce_reader(B, build.USER_READER, "rt/chatter")
    sample = build.sample(A, W, 1, size=10, ts_ns=900)
    spans = run([
        datagram(1, 3, Direction.EGRESS, announce, 1000, 7411),
        datagram(2, 3, Direction.INGRESS, announce, 1001, 7410),
        datagram(2, 3, Direction.EGRESS, reader, 1002, 7410),
        datagram(1, 3, Direction.INGRESS, reader, 1003, 7411),
        datagram(1, 3, Direction.EGRESS, sample, 2000, 7411),
        datagram(2, 3, Direction.INGRESS, sample, 2100, 7410),
    ])  # fmt: skip
    [sent] = [s for s in spans if s.kind == SpanKind.PRODUCER]
    [got] = [s for s in spans if s.kind == SpanKind.CONSUMER]
    assert (sent.name, got.name) == ("send rt/chatter", "receive rt/chatter")
    assert got.parent_span_id == sent.span_id and [link.span_id for link in got.links] == [sent.span_id]
    assert got.attributes["messaging.message.id"] == sent.attributes["messaging.message.id"] == (
        "0110aaaa.00000000.0000000a.00000103:1"
    )
    assert got.attributes["otelbpf.ros2.topic"] == "/chatter"
    assert got.attributes["otelbpf.dds.type_name"] == "std_msgs::msg::dds_::String_"
    assert got.attributes["otelbpf.dds.source_latency"] == 1200 / 1e9
    assert got.attributes["messaging.message.body.size"] == 14
    assert "otelbpf.dds.source_latency" not in sent.attributes


def test_readers_that_receive_before_the_send_is_seen_are_linked_when_it_comes():
    """A local multicast datagram can be read on another CPU before the sender's syscall
    returns (its event then sorts after the receives): the two readers still get their link."""
    announce = build.announce_writer(A, W, "rt/chatter", "std_msgs::msg::dds_::String_")
    readers = [build.announce_reader(B, build.USER_READER, "rt/chatter"),
               build.announce_reader(build.PREFIX_A[:-1] + b"\x0c", build.USER_READER, "rt/chatter")]  # fmt: skip
    sample = build.sample(A, W, 1, size=10, ts_ns=900)
    spans = run([
        datagram(1, 3, Direction.EGRESS, announce, 1000, 7411),
        datagram(2, 3, Direction.EGRESS, readers[0], 1002, 7410),
        datagram(3, 3, Direction.EGRESS, readers[1], 1003, 7412),
        datagram(2, 3, Direction.INGRESS, sample, 1990, 7410),
        datagram(3, 3, Direction.INGRESS, sample, 1995, 7412),
        datagram(1, 3, Direction.EGRESS, sample, 2000, 7411),
    ])  # fmt: skip
    [sent] = [s for s in spans if s.kind == SpanKind.PRODUCER]
    received = [s for s in spans if s.kind == SpanKind.CONSUMER]
    assert len(received) == 2
    for got in received:
        assert [link.span_id for link in got.links] == [sent.span_id]
        assert got.parent_span_id == b"" and got.attributes["otelbpf.association"] == "message"


def test_a_sole_reader_that_receives_before_the_send_is_seen_becomes_its_child():
    """The same race with one reader: the receive, and the sample its callback
    published meanwhile, join the sender's trace when the send comes."""
    announce = build.announce_writer(A, W, "rt/image", "Image_")
    relay_writer = build.USER_WRITER[:-1] + b"\x02"
    relay = build.announce_writer(B, relay_writer, "rt/objects", "Objects_")
    spans = run([
        datagram(1, 3, Direction.EGRESS, announce, 1000, 7411),
        datagram(2, 3, Direction.EGRESS, build.announce_reader(B, build.USER_READER, "rt/image"), 1002, 7410),
        datagram(2, 3, Direction.EGRESS, relay, 1003, 7410),
        datagram(2, 3, Direction.INGRESS, build.sample(A, W, 1), 1990, 7410),
        datagram(2, 3, Direction.EGRESS, build.sample(B, relay_writer, 1), 1995, 7412),
        datagram(1, 3, Direction.EGRESS, build.sample(A, W, 1), 2000, 7411),
    ])  # fmt: skip
    sent, got, relayed = (
        next(s for s in spans if s.name == name) for name in ("send rt/image", "receive rt/image", "send rt/objects")
    )
    assert got.parent_span_id == sent.span_id and [link.span_id for link in got.links] == [sent.span_id]
    assert relayed.parent_span_id == got.span_id
    assert sent.trace_id == got.trace_id == relayed.trace_id


def test_a_first_sample_sent_before_its_writer_was_announced_still_parents_its_sole_reader():
    """Cyclone DDS may send a new writer's first sample before its SEDP
    announcement: neither side knows the topic, nor so its readers, when the
    sample starts its spans. They are counted when the spans complete."""
    reader = build.announce_reader(B, build.USER_READER, "rt/image")
    announce = build.announce_writer(A, W, "rt/image", "Image_")
    spans = run([
        datagram(2, 3, Direction.EGRESS, reader, 1000, 7410),
        datagram(1, 3, Direction.INGRESS, reader, 1001, 7411),
        datagram(1, 3, Direction.EGRESS, build.sample(A, W, 1), 2000, 7411),
        datagram(2, 3, Direction.INGRESS, build.sample(A, W, 1), 2010, 7410),
        datagram(1, 3, Direction.EGRESS, announce, 2050, 7411),
        datagram(2, 3, Direction.INGRESS, announce, 2060, 7410),
    ])  # fmt: skip
    [sent] = [s for s in spans if s.kind == SpanKind.PRODUCER]
    [got] = [s for s in spans if s.kind == SpanKind.CONSUMER]
    assert (sent.name, got.name) == ("send rt/image", "receive rt/image")
    assert got.parent_span_id == sent.span_id and got.trace_id == sent.trace_id
    assert [link.span_id for link in got.links] == [sent.span_id]


def test_unknown_topic_is_said_and_the_writer_named():
    spans = run([datagram(2, 3, Direction.INGRESS, build.sample(A, W, 1), 10, 7410)])
    [span] = spans
    assert span.name == "receive (unknown topic)"
    assert span.attributes["otelbpf.dds.topic.unknown"] is True
    assert span.attributes["otelbpf.dds.writer.guid"] == "0110aaaa.00000000.0000000a.00000103"
    assert "messaging.destination.name" not in span.attributes


def test_metrics_count_samples_bytes_and_lost_samples_per_topic():
    registry = default_registry()
    metrics = SpanMetrics(ProcessResources(describe=lambda pid, comm: {}), registry.instruments())
    announce = build.announce_writer(A, W, "rt/scan")
    events = [datagram(2, 3, Direction.INGRESS, announce, 1, 7410)]
    for ts, seq in enumerate([1, 2, 5, 6], start=2):
        events.append(datagram(2, 3, Direction.INGRESS, build.sample(A, W, seq, size=96), ts, 7410))
    events.append(datagram(2, 3, Direction.INGRESS, build.header(A) + build.heartbeat(W, 5, 6), 10, 7410))
    events.append(datagram(2, 3, Direction.INGRESS, build.sample(A, W, 7, size=96), 11, 7410))
    for span in run(events):
        metrics.record(span)
    points = {
        (instrument.name, tuple(sorted(point.attributes.items()))): (point.count, point.sum)
        for process in metrics.collect().processes
        for instrument, process_points in process.histograms
        for point in process_points
    }
    key = (("messaging.destination.name", "rt/scan"), ("messaging.operation.type", "receive"), ("messaging.system", "dds"))
    assert points[("otelbpf.dds.message.size", key)] == (5, 500.0)
    assert points[("otelbpf.dds.lost_samples", key)] == (1, 2.0)  # 3 and 4, declared lost by the heartbeat

