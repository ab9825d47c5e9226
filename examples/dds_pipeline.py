"""A small ROS 2-style DDS system on Cyclone DDS, for the demo and the tests.

Roles (one process each, unmodified by the agent):

* ``camera``: publishes ``rt/camera/image`` frames at ``--rate`` Hz;
* ``detector``: takes each image and, in its callback, publishes
  ``rt/detector/objects`` for it (a subscriber that publishes);
* ``planner``: takes the objects;
* ``service-server`` / ``service-client``: a ROS 2 service pair on
  ``rq/plan_pathRequest`` and ``rr/plan_pathReply``.

Topic and type names follow ROS 2's rmw mapping (``rt/`` topics,
``rq/``/``rr/`` services, ``pkg::msg::dds_::Name_`` types), so the spans
look as they would for a ROS 2 graph. Transport: UDP only (see
:func:`udp_config` and docs/ros2-dds.md). Each process prints ``ready`` once
its entities exist, and one line per sample it handled.
"""

import argparse
import os
import sys
import threading
import time
from dataclasses import dataclass


def udp_config(multicast: bool = False) -> str:
    """A Cyclone DDS configuration that keeps every byte on UDP over loopback:
    no shared memory, unicast discovery to 127.0.0.1 unless ``multicast``."""
    peers = "" if multicast else (
        "<ParticipantIndex>auto</ParticipantIndex><Peers><Peer address='127.0.0.1'/></Peers>"
        "<MaxAutoParticipantIndex>60</MaxAutoParticipantIndex>"
    )
    return (
        "<CycloneDDS><Domain id='any'><General><Interfaces><NetworkInterface name='lo'/></Interfaces>"
        f"<AllowMulticast>{'true' if multicast else 'false'}</AllowMulticast></General>"
        f"<Discovery>{peers}</Discovery></Domain></CycloneDDS>"
    )


# Cyclone reads its configuration when the library loads: set it before importing it.
os.environ.setdefault("CYCLONEDDS_URI", udp_config("--multicast" in sys.argv))

from cyclonedds.core import Listener, Policy, Qos  # noqa: E402 (after the configuration)
from cyclonedds.domain import DomainParticipant
from cyclonedds.idl import IdlStruct
from cyclonedds.idl.types import int64, sequence, uint8
from cyclonedds.pub import DataWriter
from cyclonedds.internal import InvalidSample
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic
from cyclonedds.util import duration


@dataclass
class Image(IdlStruct, typename="sensor_msgs::msg::dds_::Image_"):
    frame: int64
    stamp_ns: int64
    data: sequence[uint8]


@dataclass
class Detections(IdlStruct, typename="vision_msgs::msg::dds_::Detection2DArray_"):
    frame: int64
    count: int64


@dataclass
class PlanRequest(IdlStruct, typename="nav_msgs::srv::dds_::GetPlan_Request_"):
    request_id: int64
    goal: int64


@dataclass
class PlanReply(IdlStruct, typename="nav_msgs::srv::dds_::GetPlan_Response_"):
    request_id: int64
    steps: int64


RELIABLE = Qos(Policy.Reliability.Reliable(max_blocking_time=duration(seconds=1)), Policy.History.KeepLast(64))


def valid(samples):
    """The samples that carry data (a writer leaving gives an InvalidSample)."""
    return [sample for sample in samples if not isinstance(sample, InvalidSample)]


def say(*words) -> None:
    """One line in one write: several roles may share a pipe."""
    sys.stdout.write(" ".join(map(str, words)) + "\n")
    sys.stdout.flush()


def camera(args) -> None:
    participant = DomainParticipant(args.domain)
    writer = DataWriter(participant, Topic(participant, "rt/camera/image", Image), qos=RELIABLE)
    wait_for_readers(writer, args.readers)
    say("ready")
    payload = [7] * args.size
    period = 1.0 / args.rate if args.rate > 0 else 0.0
    started = time.monotonic()
    for frame in range(args.frames):
        writer.write(Image(frame, time.time_ns(), payload))
        if frame == 0:
            wait_in_step(writer)
        if not args.quiet:
            say("sent", frame)
        if period:  # paced on a schedule, so a slow write does not lower the rate
            time.sleep(max(0.0, started + (frame + 1) * period - time.monotonic()))
    elapsed = time.monotonic() - started
    say("rate", round(args.frames / elapsed, 1) if elapsed > 0 else 0)
    time.sleep(args.linger)


def detector(args) -> None:
    participant = DomainParticipant(args.domain)
    writer = DataWriter(participant, Topic(participant, "rt/detector/objects", Detections), qos=RELIABLE)

    class OnImage(Listener):
        def on_data_available(self, reader):
            for image in valid(reader.take(N=16)):
                writer.write(Detections(image.frame, len(image.data) % 5))  # publish in the callback
                say("relayed", image.frame)

    reader = DataReader(participant, Topic(participant, "rt/camera/image", Image), qos=RELIABLE, listener=OnImage())
    say("ready")
    serve(args, reader)


def planner(args) -> None:
    participant = DomainParticipant(args.domain)

    class OnObjects(Listener):
        def on_data_available(self, reader):
            for detections in valid(reader.take(N=16)):
                say("planned", detections.frame)

    reader = DataReader(participant, Topic(participant, "rt/detector/objects", Detections), qos=RELIABLE, listener=OnObjects())
    say("ready")
    serve(args, reader)


def sink(args) -> None:
    """Takes images and counts them (the benchmark's reader)."""
    participant = DomainParticipant(args.domain)
    taken = [0]

    class OnImage(Listener):
        def on_data_available(self, reader):
            taken[0] += len(valid(reader.take(N=256)))

    reader = DataReader(participant, Topic(participant, "rt/camera/image", Image), qos=RELIABLE, listener=OnImage())
    say("ready")
    serve(args, reader)
    say("taken", taken[0])


def service_server(args) -> None:
    participant = DomainParticipant(args.domain)
    replies = DataWriter(participant, Topic(participant, "rr/plan_pathReply", PlanReply), qos=RELIABLE)

    class OnRequest(Listener):
        def on_data_available(self, reader):
            for request in valid(reader.take(N=16)):
                replies.write(PlanReply(request.request_id, request.goal * 2))
                say("answered", request.request_id)

    reader = DataReader(participant, Topic(participant, "rq/plan_pathRequest", PlanRequest), qos=RELIABLE, listener=OnRequest())
    say("ready")
    serve(args, reader)


def service_client(args) -> None:
    participant = DomainParticipant(args.domain)
    requests = DataWriter(participant, Topic(participant, "rq/plan_pathRequest", PlanRequest), qos=RELIABLE)
    answered = threading.Event()

    class OnReply(Listener):
        def on_data_available(self, reader):
            for reply in valid(reader.take(N=16)):
                say("reply", reply.request_id)
                answered.set()

    reader = DataReader(participant, Topic(participant, "rr/plan_pathReply", PlanReply), qos=RELIABLE, listener=OnReply())
    wait_for_readers(requests, 1)
    time.sleep(0.5)  # the reply reader is matched on the server too
    say("ready")
    for request_id in range(args.frames):
        answered.clear()
        requests.write(PlanRequest(request_id, request_id + 1))
        answered.wait(5.0)
        time.sleep(1.0 / args.rate)
    time.sleep(args.linger)


def wait_for_readers(writer, count, timeout=20.0):
    """Block until ``count`` readers matched (the first samples are not lost to discovery)."""
    deadline = time.monotonic() + timeout
    while count and time.monotonic() < deadline:
        if len(writer.get_matched_subscriptions()) >= count:
            return
        time.sleep(0.05)


def wait_in_step(writer, timeout_s: float = 2.0) -> None:
    """Block until every matched reader acknowledged what was written (at most ``timeout_s``).

    Cyclone DDS starts a reliable session with a handshake: a sample that
    reaches a reader before the writer's first heartbeat is held (or dropped
    and repaired) until the next one. Under load that hands the reader the
    first two frames in one callback. Waiting once, after the first frame,
    keeps one frame per callback from the start.
    """
    writer.wait_for_acks(duration(seconds=timeout_s))


def serve(args, *entities) -> None:
    """Run ``--seconds`` (callbacks run on Cyclone's threads), keeping ``entities``
    referenced: a DDS entity the program drops is deleted, and its reader with it."""
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        time.sleep(0.1)
    del entities


ROLES = {
    "camera": camera,
    "detector": detector,
    "planner": planner,
    "sink": sink,
    "service-server": service_server,
    "service-client": service_client,
}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--frames", type=int, default=5)
    parser.add_argument("--rate", type=float, default=5.0, help="samples per second (0: as fast as it can)")
    parser.add_argument("--quiet", action="store_true", help="camera: no line per sample")
    parser.add_argument("--size", type=int, default=64, help="image bytes (above ~1300 Cyclone fragments the sample)")
    parser.add_argument("--readers", type=int, default=1, help="camera: wait for this many matched readers")
    parser.add_argument("--seconds", type=float, default=30.0, help="subscribers: run this long")
    parser.add_argument("--linger", type=float, default=1.0, help="publishers: stay this long after the last sample")
    parser.add_argument("--multicast", action="store_true", help="discovery by multicast (default: unicast peers)")
    parser.add_argument("--domain", type=int, default=0, help="DDS domain id (tests pick their own: no cross-talk)")
    args = parser.parse_args(argv)
    ROLES[args.role](args)


if __name__ == "__main__":
    main(sys.argv[1:])
