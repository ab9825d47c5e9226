"""What an RTPS session reports: one exchange per sample a process sent or received."""

from __future__ import annotations

from dataclasses import dataclass

from protocols.base import ExchangeKind, Outcome

PROTOCOL = "rtps"

#: ROS 2 maps its names onto DDS topics with these prefixes (rmw conventions):
#: ``rt/`` topics, ``rq/`` service requests, ``rr/`` service replies.
ROS2_TOPIC_PREFIX = "rt/"
ROS2_REQUEST_PREFIX = "rq/"
ROS2_REPLY_PREFIX = "rr/"


@dataclass(slots=True, eq=False)
class RtpsExchange:
    """One sample (a DATA, or a DATA_FRAG series reassembled) from one writer.

    Sent: a PRODUCER (or, on a ROS 2 request topic, CLIENT) exchange; received:
    CONSUMER (or SERVER). It starts and ends at the datagram's time; a received
    one stays open until its flow's next sample so that work the process does
    after taking it can be placed under it (docs/ros2-dds.md).
    """

    kind: ExchangeKind
    writer_guid: bytes  # 16 bytes: GUID prefix + writer entity id
    sequence: int
    ts_ns: int
    #: Topic and type from discovery, "" while the writer is not known yet.
    topic: str = ""
    type_name: str = ""
    #: Serialized sample size in bytes (whole sample for a fragmented one).
    size: int = 0
    fragmented: bool = False
    #: The writer's source timestamp (INFO_TS), Unix ns, 0 when absent.
    source_ns: int = 0
    #: Readers of the topic announced by discovery (0: unknown).
    readers: int = 0
    #: Samples of this writer declared lost (sequence gaps never filled) just before this one.
    lost_before: int = 0
    #: The vendor of the sending participant (2 bytes, e.g. 0x0110 Eclipse Cyclone DDS).
    vendor_id: bytes = b""
    outcome: Outcome = Outcome.COMPLETE
    abandoned_ns: int = 0
    protocol: str = PROTOCOL

    @property
    def correlation_key(self) -> tuple[bytes, int]:
        """Writer GUID + sequence number: the same on every process that sees the sample."""
        return (self.writer_guid, self.sequence)

    @property
    def message_key(self) -> tuple[str, bytes, int]:
        """Names the sample agent-wide (not per connection): a received sample
        is linked to the span of its sending, whichever sockets carried it."""
        return (PROTOCOL, self.writer_guid, self.sequence)

    @property
    def sole_reader(self) -> bool:
        """Discovery announced exactly one reader: the receiving span may also be the child."""
        return self.readers == 1

    @property
    def start_ns(self) -> int:
        return self.ts_ns

    @property
    def end_ns(self) -> int:
        return self.ts_ns  # a sample moves at one instant, however late its span is closed

    def carrier(self) -> tuple:
        return ()
