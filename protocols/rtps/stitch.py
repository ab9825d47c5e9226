"""One datagram flow's RTPS session: datagrams in, one exchange per new sample out.

Builtin DATA (SPDP/SEDP discovery) feed the shared directory and make no
span. User DATA, and DATA_FRAG series once every fragment arrived, become
:class:`RtpsExchange` s. They start at once and complete later: a received
one when the flow's next new sample arrives (a repeat does not count: Cyclone
may repair a first sample within the millisecond), or after :data:`HOLD_NS`,
or when the flow closes, so that what the process does with a sample (publishing
the next one, answering a request) can be placed under its span by the
thread and time rules; a sent one at the flow's next datagram, because
Cyclone DDS may send a new writer's first sample just before its SEDP
announcement: the topic is looked up again when the exchange completes. Repeats of a sample (a
retransmission, the same sample sent to another reader) make no exchange.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from protocols.base import Direction, ExchangeCompleted, ExchangeKind, ExchangeStarted, SessionEvent
from protocols.rtps import wire
from protocols.rtps.discovery import SPDP_WRITER, is_builtin
from protocols.rtps.state import SharedState
from protocols.rtps.types import PROTOCOL, ROS2_REQUEST_PREFIX, RtpsExchange

#: A received sample's span closes at the flow's next sample, or this long after it.
HOLD_NS = 1_000_000_000
#: Fragmented samples being reassembled per flow.
MAX_PARTIAL = 64
#: Fragment numbers remembered per partial sample (more: given up, counted).
MAX_FRAGMENTS = 65536
#: Builtin (discovery) samples are reassembled byte for byte up to this size.
MAX_DISCOVERY_SAMPLE = 256 * 1024
#: Received samples held open per flow (more: the oldest completes early).
MAX_HELD = 256


@dataclass(slots=True)
class _Partial:
    sample_size: int
    fragment_size: int
    received: set[int] = field(default_factory=set)
    #: Only for discovery samples: their bytes, by fragment number.
    chunks: dict[int, bytes] | None = None
    #: The writer's source timestamp, from the datagram of whichever fragment carried one.
    source_ns: int = 0

    @property
    def expected(self) -> int:
        return max(1, -(-self.sample_size // self.fragment_size))

    def complete(self) -> bool:
        return len(self.received) >= self.expected


class RtpsSession:
    protocol = PROTOCOL

    def __init__(self, state: SharedState) -> None:
        self.state = state
        self.parse_errors = 0
        #: Fragmented samples lost part-way (evicted before their last fragment).
        self.fragments_dropped = 0
        self._partial: OrderedDict[tuple[bytes, int], _Partial] = OrderedDict()
        #: Exchanges started and not completed yet, by direction.
        self._held: dict[Direction, list[RtpsExchange]] = {Direction.INGRESS: [], Direction.EGRESS: []}
        #: Names this flow's windows of received samples in the shared state.
        self._serial = state.new_session_serial()
        #: The process whose flow this is, when the agent says (0: unknown).
        self.pid = 0
        #: During a feed: how many held received samples the next new sample ends.
        self._ended_by_new_sample = 0

    def feed(self, direction: Direction, data: bytes, ts_ns: int, missing: int = 0) -> list[SessionEvent]:
        try:
            message = wire.parse_message(data, missing)
        except wire.RtpsError:
            self.parse_errors += 1
            return []
        out: list[SessionEvent] = []
        held = self._held[direction]
        previous = len(held)
        if previous and direction == Direction.INGRESS:
            if ts_ns - held[0].ts_ns > HOLD_NS:
                self._complete_held(direction, out)
            #: received ones end when a new sample arrives (not a repeat: a repair may come at once)
            self._ended_by_new_sample = len(held)
            previous = 0
        source_ns = 0
        prefix = message.header.guid_prefix
        if self.pid and direction == Direction.EGRESS:
            self.state.note_participant(prefix, self.pid)
        elif self.pid and self.state.participant_pid(prefix) == self.pid:
            return out  # its own multicast, looped back to the sending process: not a reception
        for item in message.submessages:
            kind = type(item)
            if kind is wire.DataSubmessage:
                self._data(direction, message.header, item, source_ns, ts_ns, out)
            elif kind is wire.InfoTimestamp:
                source_ns = item.time_ns or 0
            elif kind is wire.Heartbeat and direction == Direction.INGRESS:
                window = self.state.window(self._received_key(prefix + item.writer_id), create=False)
                if window is not None:
                    window.writer_dropped_below(item.first)
            elif kind is wire.Gap and direction == Direction.INGRESS:
                window = self.state.window(self._received_key(prefix + item.writer_id), create=False)
                if window is not None:
                    window.irrelevant(item.irrelevant)
        if previous:  # sent ones: after this datagram's discovery data was read
            self._complete_held(direction, out, previous)
        self._ended_by_new_sample = 0
        if self.pid:
            self.state.data_watch.check(ts_ns, self.state.directory)
        return out

    def close(self, ts_ns: int) -> list[SessionEvent]:
        out: list[SessionEvent] = []
        for direction in self._held:
            self._complete_held(direction, out)
        self._partial.clear()
        return out

    # -- samples ----------------------------------------------------------------

    def _data(self, direction, header, item: wire.DataSubmessage, source_ns, ts_ns, out) -> None:
        writer_guid = header.guid_prefix + item.writer_id
        size = len(item.payload) + item.missing
        payload = item.payload
        if item.fragmented:
            whole = self._reassemble(writer_guid, item, source_ns)
            if whole is None:
                return
            size, (payload, source_ns) = item.sample_size, whole
        if is_builtin(item.writer_id):  # discovery (or liveliness): no span
            directory = self.state.directory
            endpoint = directory.learn(header.guid_prefix, item, b"" if item.missing else payload, ts_ns)
            if direction == Direction.EGRESS and self.pid:
                if endpoint is not None and endpoint.writer:
                    self.state.data_watch.announced(self.pid, header.guid_prefix, endpoint.topic, ts_ns)
                elif item.writer_id == SPDP_WRITER and directory.announces_shared_memory(header.guid_prefix):
                    self.state.data_watch.announced_shared_memory(self.pid, header.guid_prefix, ts_ns)
            return
        self._sample(direction, header, writer_guid, item, size, source_ns, ts_ns, out)

    def _sample(self, direction, header, writer_guid, item, size, source_ns, ts_ns, out) -> None:
        state = self.state
        if direction == Direction.EGRESS:
            window = state.window(("sent", writer_guid))
        else:
            window = state.window(self._received_key(writer_guid))
        if not window.observe(item.sequence):
            state.repeats += 1
            return
        if self.pid:
            state.data_watch.sample(self.pid)
        endpoint = state.directory.endpoint(writer_guid)
        topic = endpoint.topic if endpoint is not None else ""
        exchange = RtpsExchange(
            kind=_kind(direction, topic),
            writer_guid=writer_guid,
            sequence=item.sequence,
            ts_ns=ts_ns,
            topic=topic,
            type_name=endpoint.type_name if endpoint is not None else "",
            size=size,
            fragmented=item.fragmented,
            source_ns=source_ns,
            readers=state.directory.readers(topic) if topic else 0,
            lost_before=window.take_lost() if direction == Direction.INGRESS else 0,
            vendor_id=header.vendor_id,
        )
        if self._ended_by_new_sample:  # before this sample opens its window
            self._complete_held(direction, out, self._ended_by_new_sample)
            self._ended_by_new_sample = 0
        out.append(ExchangeStarted(exchange))
        held = self._held[direction]
        held.append(exchange)
        if len(held) > MAX_HELD:
            out.append(self._completed(held.pop(0)))

    def _received_key(self, writer_guid: bytes) -> tuple:
        """Received samples are counted per process when the agent named it
        (one sample may reach a process on its multicast and its unicast
        socket), else per flow. Not by INFO_DST: Cyclone adds it to repairs only."""
        if self.pid:
            return ("received by process", self.pid, writer_guid)
        return ("received on flow", self._serial, writer_guid)

    def _reassemble(self, writer_guid: bytes, item: wire.DataSubmessage, source_ns: int) -> tuple[bytes, int] | None:
        """Add a DATA_FRAG's fragments; once complete, the whole sample's bytes
        (only kept for discovery samples: b"" for user data) and its source
        timestamp, else None."""
        key = (writer_guid, item.sequence)
        partial = self._partial.get(key)
        if partial is None:
            partial = self._partial[key] = _Partial(item.sample_size, item.fragment_size)
            if is_builtin(item.writer_id) and item.sample_size <= MAX_DISCOVERY_SAMPLE:
                partial.chunks = {}
            if len(self._partial) > MAX_PARTIAL:
                self._partial.popitem(last=False)
                self.fragments_dropped += 1
        if partial.fragment_size != item.fragment_size or partial.sample_size != item.sample_size:
            self.parse_errors += 1
            return None
        partial.source_ns = partial.source_ns or source_ns
        last = min(item.fragment_start + item.fragments, partial.expected + 1)
        for number in range(item.fragment_start, last):
            partial.received.add(number)
            if partial.chunks is not None and not item.missing:
                offset = (number - item.fragment_start) * item.fragment_size
                partial.chunks[number] = item.payload[offset : offset + item.fragment_size]
        if len(partial.received) > MAX_FRAGMENTS:
            del self._partial[key]
            self.fragments_dropped += 1
            return None
        if not partial.complete():
            return None
        del self._partial[key]
        if partial.chunks is None or len(partial.chunks) < partial.expected:
            return b"", partial.source_ns
        return b"".join(partial.chunks[n] for n in sorted(partial.chunks))[: partial.sample_size], partial.source_ns

    # -- held receptions ------------------------------------------------------

    def _complete_held(self, direction: Direction, out: list[SessionEvent], count: int | None = None) -> None:
        held = self._held[direction]
        count = len(held) if count is None else count
        done, self._held[direction] = held[:count], held[count:]
        out.extend(self._completed(exchange) for exchange in done)

    def _completed(self, exchange: RtpsExchange) -> ExchangeCompleted:
        """End it, naming its topic and counting its readers if discovery
        announced them meanwhile (a receiving span whose sole reader is known
        only now still becomes its sender's child: ``Linker.message_completed``)."""
        directory = self.state.directory
        if not exchange.topic:
            endpoint = directory.endpoint(exchange.writer_guid)
            if endpoint is not None:
                exchange.topic, exchange.type_name = endpoint.topic, endpoint.type_name
        if not exchange.readers and exchange.topic:
            exchange.readers = directory.readers(exchange.topic)
        return ExchangeCompleted(exchange)


def _kind(direction: Direction, topic: str) -> ExchangeKind:
    """PRODUCER/CONSUMER; a ROS 2 service request is CLIENT where sent, SERVER where received."""
    if topic.startswith(ROS2_REQUEST_PREFIX):
        return ExchangeKind.CLIENT if direction == Direction.EGRESS else ExchangeKind.SERVER
    return ExchangeKind.PRODUCER if direction == Direction.EGRESS else ExchangeKind.CONSUMER
