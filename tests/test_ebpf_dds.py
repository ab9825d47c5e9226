"""Real eBPF, real Cyclone DDS: RTPS over UDP becomes linked PRODUCER/CONSUMER spans.

The DDS processes are examples/dds_pipeline.py (the cyclonedds package, its
bundled Cyclone DDS C library), configured for UDP on loopback with unicast
discovery and no shared memory. They run under one launcher process that
waits for the agent (``--pid`` of the launcher traces its children, so
discovery is seen from the start), and the agent runs with ``--udp``,
exporting OTLP to tests/otlp_receiver.py (traces and metrics decoded from the
official protobufs).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter, defaultdict

import pytest
from otlp_receiver import OtlpReceiver, attributes_dict

from conftest import EXAMPLES

pytest.importorskip("cyclonedds")
pytestmark = pytest.mark.ebpf

PIPELINE = str(EXAMPLES / "dds_pipeline.py")
PRODUCER, CONSUMER, CLIENT, SERVER = 4, 5, 3, 2  # OTLP SpanKind


class Launcher:
    """A shell that starts the DDS processes once told to (``go``), so the
    agent is attached first; ``commands`` run in order, ``&`` ones in the background."""

    def __init__(self, script: str, prefix: list[str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [*(prefix or []), "bash", "-c", f"read go; {script}; wait"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip

    def run(self, timeout: float = 60) -> str:
        out, _ = self.proc.communicate("go\n", timeout=timeout)
        return out


#: A DDS domain of this run's own: participants of another test run on the host
#: (another checkout's tests at the same time) would otherwise match ours.
DOMAIN = 1 + os.getpid() % 200


def role(name: str, *args: str) -> str:
    """An examples/dds_pipeline.py role; in this run's domain unless ``args`` name one."""
    domain = [] if "--domain" in args else ["--domain", str(DOMAIN)]
    return " ".join([sys.executable, PIPELINE, name, *args, *domain])


def traced(agent, receiver, launcher: Launcher, timeout: float = 60):
    """Run the launcher's processes under the agent; (their output, spans, metric points)."""
    run = agent(
        ["--pid", str(launcher.proc.pid), "--udp", "--otlp-endpoint", receiver.grpc_endpoint, "--metrics-interval", "1"]
    )
    output = launcher.run(timeout)
    assert run.stop() == 0, run.output
    return output, receiver.spans(), metric_points(receiver)


def metric_points(receiver) -> dict[str, list[tuple[dict, int, float]]]:
    """name -> (attributes, count, sum) of every histogram point received (cumulative: the last wins)."""
    points: dict[str, dict[tuple, tuple[dict, int, float]]] = defaultdict(dict)
    for request in receiver.metric_requests:
        for resource_metrics in request.resource_metrics:
            pid = attributes_dict(resource_metrics.resource.attributes).get("process.pid")
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    for point in metric.histogram.data_points:
                        attrs = attributes_dict(point.attributes)
                        key = (pid, tuple(sorted(attrs.items())))
                        points[metric.name][key] = (attrs, point.count, point.sum)
    return {name: list(by_key.values()) for name, by_key in points.items()}


def rtps_spans(spans):
    return [s for s in spans if s.scope == "otelbpf.rtps"]


def describe(traces) -> str:
    """Every trace's spans, one per line, in start order: what a failed chain assertion shows."""
    lines = []
    for spans in traces:
        lines.append(f"trace {spans[0].span.trace_id.hex()[:8]}:")
        for s in sorted(spans, key=lambda s: s.span.start_time_unix_nano):
            lines.append(
                f"  {s.span.start_time_unix_nano % 10**11 / 1e6:10.3f} ms pid {s.resource.get('process.pid')}"
                f" kind {s.span.kind} {s.name!r} id {s.span.span_id.hex()[:6]} parent {s.span.parent_span_id.hex()[:6]}"
                f" message {s.attributes.get('messaging.message.id')} via {s.attributes.get('otelbpf.association')}"
            )
    return "\n".join(lines)


def by_message(spans, kind):
    out = defaultdict(list)
    for span in spans:
        if span.span.kind == kind:
            out[span.attributes["messaging.message.id"]].append(span)
    return out


def test_camera_detector_planner_is_one_trace_per_frame_with_fragmented_images(agent):
    frames = 4
    launcher = Launcher(
        f"{role('planner', '--seconds', '8')} & {role('detector', '--seconds', '8')} & sleep 1; "
        f"{role('camera', '--frames', str(frames), '--rate', '5', '--size', '20000')}"
    )
    with OtlpReceiver(http_port=None) as receiver:
        output, spans, metrics = traced(agent, receiver, launcher)
    assert output.count("planned") == frames, output
    spans = rtps_spans(spans)
    traces = defaultdict(list)
    for span in spans:
        traces[span.span.trace_id].append(span)
    chains = [t for t in traces.values() if len(t) == 4]
    assert len(chains) == frames, describe(traces.values())
    for chain in chains:
        names = {(s.span.kind, s.name) for s in chain}
        assert names == {
            (PRODUCER, "send rt/camera/image"), (CONSUMER, "receive rt/camera/image"),
            (PRODUCER, "send rt/detector/objects"), (CONSUMER, "receive rt/detector/objects"),
        }  # fmt: skip
        by_id = {s.span.span_id: s for s in chain}
        sent_image, got_image, sent_objects, got_objects = (
            next(s for s in chain if (s.span.kind, s.name) == key)
            for key in [
                (PRODUCER, "send rt/camera/image"), (CONSUMER, "receive rt/camera/image"),
                (PRODUCER, "send rt/detector/objects"), (CONSUMER, "receive rt/detector/objects"),
            ]
        )  # fmt: skip
        # linked by writer GUID + sequence number, and parented (one reader each)
        assert [link.span_id for link in got_image.span.links] == [sent_image.span.span_id]
        assert got_image.span.parent_span_id == sent_image.span.span_id
        assert got_image.attributes["messaging.message.id"] == sent_image.attributes["messaging.message.id"]
        # the detector's callback published on its receiving thread: child of its CONSUMER span
        assert sent_objects.span.parent_span_id == got_image.span.span_id
        assert sent_objects.attributes["otelbpf.association"] in ("thread", "process")
        assert got_objects.span.parent_span_id == sent_objects.span.span_id
        assert by_id[sent_image.span.span_id].span.parent_span_id == b""
        # three processes
        assert len({s.resource["process.pid"] for s in chain}) == 3
        # messaging conventions; a 20000-byte image crossed as DATA_FRAG, one message
        attrs = got_image.attributes
        assert attrs["messaging.system"] == "dds"
        assert attrs["messaging.operation.type"] == "receive"
        assert attrs["messaging.destination.name"] == "rt/camera/image"
        assert attrs["otelbpf.ros2.topic"] == "/camera/image"
        assert attrs["otelbpf.dds.type_name"] == "sensor_msgs::msg::dds_::Image_"
        assert attrs["otelbpf.dds.fragmented"] is True
        assert attrs["messaging.message.body.size"] > 20000
        assert attrs["network.transport"] == "udp"
        assert sent_image.attributes["messaging.operation.type"] == "send"
    # no sample counted twice on either side
    for kind in (PRODUCER, CONSUMER):
        assert all(len(v) == 1 for v in by_message(spans, kind).values())
    # metrics: per topic and operation, counts and bytes; latency on receives
    sizes = {
        (a["messaging.destination.name"], a["messaging.operation.type"]): (count, total)
        for a, count, total in metrics["otelbpf.dds.message.size"]
    }
    assert sizes[("rt/camera/image", "send")][0] == frames and sizes[("rt/camera/image", "receive")][0] == frames
    assert sizes[("rt/camera/image", "send")][1] > 20000 * frames
    assert sizes[("rt/detector/objects", "receive")][0] == frames
    latency = {a["messaging.destination.name"]: count for a, count, _ in metrics["otelbpf.dds.latency"]}
    assert latency == {"rt/camera/image": frames, "rt/detector/objects": frames}


def test_ros2_style_service_gives_a_client_server_pair(agent):
    calls = 3
    launcher = Launcher(
        f"{role('service-server', '--seconds', '8')} & sleep 1; {role('service-client', '--frames', str(calls), '--rate', '5')}"
    )
    with OtlpReceiver(http_port=None) as receiver:
        output, spans, _ = traced(agent, receiver, launcher)
    assert output.count("reply") == calls, output
    spans = rtps_spans(spans)
    clients = [s for s in spans if s.span.kind == CLIENT]
    servers = {s.span.parent_span_id: s for s in spans if s.span.kind == SERVER}
    assert len(clients) == calls and len(servers) == calls
    for client in clients:
        assert client.name == "/plan_path"
        assert client.attributes["rpc.system"] == "ros2"
        assert client.attributes["messaging.destination.name"] == "rq/plan_pathRequest"
        server = servers[client.span.span_id]
        assert server.resource["process.pid"] != client.resource["process.pid"]
        assert server.span.trace_id == client.span.trace_id
        # the reply, published in the request callback: under the SERVER span, received by the client
        [reply] = [s for s in spans if s.span.kind == PRODUCER and s.span.parent_span_id == server.span.span_id]
        assert reply.attributes["otelbpf.ros2.service"] == "/plan_path"
        [received] = [s for s in spans if s.span.kind == CONSUMER and s.span.parent_span_id == reply.span.span_id]
        assert received.resource["process.pid"] == client.resource["process.pid"]


@pytest.fixture
def lossy_namespace():
    """A network namespace that drops 10% of the user-data datagrams it receives
    (netfilter INPUT, so every send leaves its syscall and is seen): reliable
    DDS writers must repair, and nothing outside the namespace is touched.

    Only the user-traffic unicast ports lose packets (RTPS port mapping:
    7400 + 250 x domain + 11 + 2 x participant index; discovery uses the even
    ports, 10 + 2 x index). Dropping discovery too made the run hinge on Cyclone's
    30 s SPDP resend period: one lost announcement and the reader never
    matched the writer within the test. This test is about data repair."""
    if not shutil.which("iptables"):
        pytest.skip("iptables is missing")
    ns = f"otb-dds-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        data_ports = ",".join(str(7400 + 250 * DOMAIN + 11 + 2 * index) for index in range(15))  # multiport takes 15
        drop = ["iptables", "-A", "INPUT", "-p", "udp", "-m", "multiport", "--dports", data_ports,
                "-m", "statistic", "--mode", "random", "--probability", "0.1", "-j", "DROP"]  # fmt: skip
        if subprocess.run(["ip", "netns", "exec", ns, *drop]).returncode:
            pytest.skip("iptables multiport/statistic matches are not available")
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def test_retransmissions_after_loss_are_not_counted_twice(agent, lossy_namespace, tmp_path):
    frames = 20
    capture = tmp_path / "lossy.pcap"
    launcher = Launcher(
        f"tcpdump -i lo -U -w {capture} udp 2>/dev/null & dump=$!; "
        # the writer lingers 5 s after its last frame so that repairs of a loaded machine's
        # losses (10% of data datagrams dropped) still reach the reader
        f"{role('detector', '--seconds', '14')} > {tmp_path / 'detector.out'} & sleep 1; "
        f"{role('camera', '--frames', str(frames), '--rate', '10', '--linger', '5')}; sleep 1; kill -INT $dump",
        prefix=["ip", "netns", "exec", lossy_namespace],
    )
    with OtlpReceiver(http_port=None) as receiver:
        output, spans, metrics = traced(agent, receiver, launcher, timeout=90)
    detector_output = (tmp_path / "detector.out").read_text()
    relayed = {int(line.split()[1]) for line in detector_output.splitlines() if line.startswith("relayed")}
    assert relayed == set(range(frames)), output + detector_output  # reliable: every frame arrived in the end
    # the wire really carried repairs: some image samples were sent more than once
    # (tcpdump sees packets before netfilter drops them)
    sys.path.insert(0, str(EXAMPLES.parent))
    from otelbpf.core.events import DatagramEvent
    from otelbpf.sources.pcap import PcapSource
    from protocols.rtps import wire

    sends = Counter()
    for event in PcapSource(str(capture), perspective="server").events():
        if type(event) is DatagramEvent:
            try:
                message = wire.parse_message(event.data)
            except wire.RtpsError:
                continue
            for item in message.submessages:
                if type(item) is wire.DataSubmessage and item.writer_id == bytes.fromhex("00000203"):
                    sends[(message.header.guid_prefix, item.sequence)] += 1
    assert any(count > 1 for count in sends.values()), sends
    # ...and each sample is one span where it was sent and one where it was received
    spans = [s for s in rtps_spans(spans) if s.attributes.get("messaging.destination.name") == "rt/camera/image"]
    sent, received = by_message(spans, PRODUCER), by_message(spans, CONSUMER)
    assert len(sent) == frames and all(len(v) == 1 for v in sent.values())
    assert len(received) == frames and all(len(v) == 1 for v in received.values())
    counts = {a["messaging.operation.type"]: count for a, count, _ in metrics["otelbpf.dds.message.size"]
              if a.get("messaging.destination.name") == "rt/camera/image"}  # fmt: skip
    assert counts == {"send": frames, "receive": frames}


def test_multicast_sample_with_two_readers_is_linked_not_parented(agent):
    frames = 3
    multicast = "--multicast"
    launcher = Launcher(
        f"{role('sink', '--seconds', '7', multicast)} & {role('sink', '--seconds', '7', multicast)} & sleep 1; "
        f"{role('camera', '--frames', str(frames), '--rate', '5', '--readers', '2', multicast)}"
    )
    with OtlpReceiver(http_port=None) as receiver:
        output, spans, _ = traced(agent, receiver, launcher)
    assert output.count("taken 3") == 2, output
    spans = rtps_spans(spans)
    sent = by_message(spans, PRODUCER)
    received = by_message(spans, CONSUMER)
    assert len(sent) == frames and all(len(v) == 1 for v in sent.values())
    assert set(received) == set(sent)
    for message_id, readers in received.items():
        [producer] = sent[message_id]
        assert len(readers) == 2 and len({r.resource["process.pid"] for r in readers}) == 2, [(r.resource["process.pid"], r.attributes.get("network.peer.port"), r.attributes.get("thread.id"), r.span.start_time_unix_nano) for r in readers]
        for reader in readers:
            # one sample, two readers: a link to the sending span each, and no parent
            assert [link.span_id for link in reader.span.links] == [producer.span.span_id]
            assert reader.span.parent_span_id == b""
            assert reader.attributes["otelbpf.association"] == "message"
