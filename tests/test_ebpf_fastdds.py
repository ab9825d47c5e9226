"""Real eBPF, real Fast DDS: eProsima's RTPS becomes the same linked spans as Cyclone's.

The Fast DDS nodes are examples/fastdds/build/image_node (C++, Debian's
libfastrtps-dev 2.9, built by scripts/install.sh), configured for UDPv4 on
loopback with unicast discovery (``--transport udp``) or left on Fast DDS's
default shared memory (``--transport shm``). As in tests/test_ebpf_dds.py, they
run under a launcher that waits for the agent, which traces it and its
children (``--pid``) with ``--udp`` and exports OTLP to tests/otlp_receiver.py.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from conftest import EXAMPLES, OTELBPF
from otlp_receiver import OtlpReceiver
from test_ebpf_dds import CONSUMER, PRODUCER, Launcher, by_message, role, rtps_spans, traced

pytestmark = pytest.mark.ebpf

NODE = EXAMPLES / "fastdds" / "build" / "image_node"
if not NODE.exists():
    pytest.skip(f"{NODE} is not built (scripts/install.sh, or make -C examples/fastdds)", allow_module_level=True)

FAST_DDS, CYCLONE = "eProsima Fast DDS", "Eclipse Cyclone DDS"
#: A DDS domain of this run's own, apart from tests/test_ebpf_dds.py's (1 + pid % 200):
#: participants of another test or test run on the host would otherwise match ours.
DOMAIN = str(1 + (os.getpid() + 100) % 200)


def node(*args: str) -> str:
    return " ".join([str(NODE), *args, "--domain", DOMAIN])


def cyclone(name: str, *args: str) -> str:
    """An examples/dds_pipeline.py role (Cyclone DDS) in this run's domain."""
    return role(name, *args, "--domain", DOMAIN)


def assert_one_to_one(spans, frames: int, vendor: str, fragmented: bool = False) -> None:
    """``frames`` samples: one PRODUCER and one CONSUMER each, in two processes,
    the CONSUMER linked to (and, one reader, child of) its PRODUCER."""
    spans = [s for s in rtps_spans(spans) if s.attributes.get("otelbpf.dds.vendor") == vendor]
    sent, received = by_message(spans, PRODUCER), by_message(spans, CONSUMER)
    assert len(sent) == frames and set(received) == set(sent), sorted((s.name, s.span.kind) for s in spans)
    for message_id, [producer] in sent.items():
        [consumer] = received[message_id]
        assert [link.span_id for link in consumer.span.links] == [producer.span.span_id]
        assert consumer.span.parent_span_id == producer.span.span_id
        assert consumer.span.trace_id == producer.span.trace_id
        assert consumer.resource["process.pid"] != producer.resource["process.pid"]
        for span, operation in ((producer, "send"), (consumer, "receive")):
            attrs = span.attributes
            assert span.name == f"{operation} rt/camera/image"  # the topic, from Fast DDS's SEDP
            assert attrs["messaging.operation.type"] == operation
            assert attrs["messaging.destination.name"] == "rt/camera/image"
            assert attrs["otelbpf.dds.type_name"] == "sensor_msgs::msg::dds_::Image_"
            assert attrs["otelbpf.ros2.topic"] == "/camera/image"
            assert attrs["otelbpf.dds.vendor"] == vendor
            assert attrs["network.transport"] == "udp"
            assert attrs.get("otelbpf.dds.fragmented", False) is fragmented
            assert "otelbpf.dds.topic.unknown" not in attrs


def test_fastdds_publisher_and_subscriber_give_linked_producer_consumer_spans(agent):
    frames = 4
    launcher = Launcher(f"{node('subscriber', '--seconds', '6')} & sleep 1; {node('publisher', '--frames', str(frames))}")
    with OtlpReceiver(http_port=None) as receiver:
        output, spans, metrics = traced(agent, receiver, launcher)
    assert f"taken {frames}" in output, output
    assert_one_to_one(spans, frames, FAST_DDS)
    [size] = {rtps.attributes["messaging.message.body.size"] for rtps in rtps_spans(spans)}
    assert size == 4 + 8 + 8 + 4 + 64  # encapsulation, frame, stamp, length, 64 bytes
    counts = {a["messaging.operation.type"]: count for a, count, _ in metrics["otelbpf.dds.message.size"]
              if a.get("messaging.destination.name") == "rt/camera/image"}  # fmt: skip
    assert counts == {"send": frames, "receive": frames}


def test_fastdds_samples_above_64_kilobytes_cross_as_fragments_and_make_one_span_each(agent):
    frames, size = 2, 100_000
    launcher = Launcher(
        f"{node('subscriber', '--seconds', '6')} & sleep 1; {node('publisher', '--frames', str(frames), '--size', str(size))}"
    )
    with OtlpReceiver(http_port=None) as receiver:
        output, spans, _ = traced(agent, receiver, launcher)
    assert f"taken {frames}" in output, output
    assert_one_to_one(spans, frames, FAST_DDS, fragmented=True)
    assert {s.attributes["messaging.message.body.size"] for s in rtps_spans(spans)} == {4 + 8 + 8 + 4 + size}


def test_one_fastdds_sample_sent_to_two_readers_is_one_producer_span_linked_from_both(agent):
    """Fast DDS sends a sample once per reader (unicast): one PRODUCER span, and
    each reader's CONSUMER span linked to it, not its child (two readers)."""
    frames = 3
    launcher = Launcher(
        f"{node('subscriber', '--seconds', '6')} & {node('subscriber', '--seconds', '6')} & sleep 1; "
        f"{node('publisher', '--frames', str(frames), '--readers', '2')}"
    )
    with OtlpReceiver(http_port=None) as receiver:
        output, spans, _ = traced(agent, receiver, launcher)
    assert output.count(f"taken {frames}") == 2, output
    spans = rtps_spans(spans)
    sent, received = by_message(spans, PRODUCER), by_message(spans, CONSUMER)
    assert len(sent) == frames and all(len(v) == 1 for v in sent.values())
    assert set(received) == set(sent)
    for message_id, readers in received.items():
        [producer] = sent[message_id]
        assert len({r.resource["process.pid"] for r in readers}) == 2 == len(readers)
        for reader in readers:
            assert [link.span_id for link in reader.span.links] == [producer.span.span_id]
            assert reader.span.parent_span_id == b""
            assert reader.attributes["otelbpf.association"] == "message"


def test_a_cyclone_subscriber_reads_a_fastdds_publisher(agent):
    pytest.importorskip("cyclonedds")
    frames = 3
    launcher = Launcher(f"{cyclone('sink', '--seconds', '5')} & sleep 1.5; {node('publisher', '--frames', str(frames))}")
    with OtlpReceiver(http_port=None) as receiver:
        output, spans, _ = traced(agent, receiver, launcher)
    assert f"taken {frames}" in output, output  # examples/dds_pipeline.py's Cyclone sink
    assert_one_to_one(spans, frames, FAST_DDS)


def test_a_fastdds_subscriber_reads_a_cyclone_publisher(agent):
    pytest.importorskip("cyclonedds")
    frames = 3
    launcher = Launcher(f"{node('subscriber', '--seconds', '5')} & sleep 1; {cyclone('camera', '--frames', str(frames))}")
    with OtlpReceiver(http_port=None) as receiver:
        output, spans, _ = traced(agent, receiver, launcher)
    assert f"taken {frames}" in output, output
    assert_one_to_one(spans, frames, CYCLONE)


def test_fastdds_shared_memory_is_reported_by_doctor_and_by_the_agent(agent):
    """Fast DDS's default transports: samples (and SEDP) take shared memory,
    only SPDP crosses UDP. doctor sees the segments; the agent says once per
    process that its samples are not crossing sockets."""
    launcher = Launcher(
        # the subscriber outlasts the publisher's matching (slow on a loaded host) and 8 s of samples
        f"{node('subscriber', '--seconds', '16', '--transport', 'shm')} & sleep 1; "
        f"{node('publisher', '--frames', '40', '--rate', '5', '--transport', 'shm')}"
    )
    with OtlpReceiver(http_port=None) as receiver:
        run = agent(["--pid", str(launcher.proc.pid), "--udp", "--otlp-endpoint", receiver.grpc_endpoint])
        launcher.proc.stdin.write("go\n")
        launcher.proc.stdin.flush()
        time.sleep(4)  # both participants exist: their /dev/shm segments too
        doctor = subprocess.run([*OTELBPF, "doctor"], capture_output=True, text=True, timeout=120)
        output, _ = launcher.proc.communicate(timeout=90)
        assert run.stop() == 0, run.output
        spans = rtps_spans(receiver.spans())
    assert "taken 40" in output, output  # the samples did arrive, through shared memory
    [line] = [line for line in doctor.stdout.splitlines() if "dds shared memory" in line]
    assert "Fast DDS shared-memory transport" in line and "not traced" in line, doctor.stdout
    assert not spans, [s.name for s in spans]  # nothing crossed a socket
    notices = [line for line in run.stderr_lines if "offers Fast DDS shared-memory transport" in line]
    assert len(notices) == 2, run.output  # publisher and subscriber, once each
    assert all("docs/ros2-dds.md" in notice for notice in notices)
