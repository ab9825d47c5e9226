"""RTPS sessions: discovery, one exchange per sample, repeats, fragments, losses."""

from __future__ import annotations

from protocols.base import Direction, ExchangeCompleted, ExchangeKind, ExchangeStarted
from protocols.rtps import RtpsDetector
from protocols.rtps.discovery import Directory, guid_text
from protocols.rtps.state import LOSS_HORIZON
from protocols.rtps.stitch import HOLD_NS
from protocols.rtps.tests import build

IN, OUT = Direction.INGRESS, Direction.EGRESS
A, B = build.PREFIX_A, build.PREFIX_B
W = build.USER_WRITER
WRITER = A + W


def new_session(detector: RtpsDetector | None = None):
    detector = detector or RtpsDetector()
    return detector, detector.new_session(IN)


def started(events):
    return [e.exchange for e in events if type(e) is ExchangeStarted]


def completed(events):
    return [e.exchange for e in events if type(e) is ExchangeCompleted]


def test_detector_takes_rtps_only():
    detector = RtpsDetector()
    assert detector.detect(IN, build.header()) == IN
    assert detector.detect(OUT, build.header()) == OUT
    assert detector.detect(IN, b"GET / HTTP/1.1\r\n\r\n") is None
    assert detector.detect(IN, b"RTPS") is None


def test_sedp_maps_writer_and_reader_guids_to_topics_both_endiannesses():
    detector, session = new_session()
    assert session.feed(IN, build.announce_writer(A, W, "rt/chatter", "std_msgs::msg::dds_::String_"), 1) == []
    session.feed(IN, build.announce_reader(B, build.USER_READER, "rt/chatter", little=False), 2)
    directory: Directory = detector.state.directory
    writer = directory.endpoint(WRITER)
    assert (writer.topic, writer.type_name, writer.writer) == ("rt/chatter", "std_msgs::msg::dds_::String_", True)
    assert directory.endpoint(B + build.USER_READER).topic == "rt/chatter"
    assert directory.readers("rt/chatter") == 1


def test_a_received_sample_names_topic_and_completes_at_the_next_sample():
    detector, session = new_session()
    session.feed(IN, build.announce_writer(A, W, "rt/camera/image", "Image_"), 1)
    session.feed(IN, build.announce_reader(B, build.USER_READER, "rt/camera/image"), 2)
    first = session.feed(IN, build.sample(A, W, 1, size=100, ts_ns=900), 1000)
    [exchange] = started(first)
    assert completed(first) == []  # held: what the process does next may be its child
    assert exchange.kind == ExchangeKind.CONSUMER
    assert (exchange.topic, exchange.type_name, exchange.sequence, exchange.writer_guid) == ("rt/camera/image", "Image_", 1, WRITER)
    assert exchange.size == 104 and exchange.source_ns == 900 and exchange.sole_reader
    assert exchange.message_key == ("rtps", WRITER, 1) and exchange.start_ns == exchange.end_ns == 1000
    assert completed(session.feed(IN, build.sample(A, W, 1), 1500)) == []  # a repair of it: still held
    second = session.feed(IN, build.sample(A, W, 2), 2000)
    assert completed(second) == [exchange]
    assert [e.sequence for e in started(second)] == [2]
    assert completed(session.close(3000))[0].sequence == 2


def test_held_sample_completes_after_the_hold_time_on_any_datagram():
    _, session = new_session()
    session.feed(IN, build.sample(A, W, 1), 1000)
    assert completed(session.feed(IN, build.header(A) + build.heartbeat(W, 1, 1), 1000 + HOLD_NS // 2)) == []
    assert len(completed(session.feed(IN, build.header(A) + build.heartbeat(W, 1, 1), 1001 + HOLD_NS))) == 1


def test_a_sent_sample_is_a_producer_completed_at_the_next_datagram():
    _, session = new_session()
    [exchange] = started(session.feed(OUT, build.sample(A, W, 1), 10))
    assert exchange.kind == ExchangeKind.PRODUCER and exchange.topic == ""
    # its announcement follows it (Cyclone may send a new writer's first sample first)
    done = completed(session.feed(OUT, build.announce_writer(A, W, "rt/late"), 11))
    assert done == [exchange] and exchange.topic == "rt/late"


def test_unknown_topic_until_a_periodic_resend_of_discovery():
    detector, session = new_session()
    [early] = started(session.feed(IN, build.sample(A, W, 1), 1))
    session.feed(IN, build.sample(A, W, 2), 2)
    assert early.topic == ""  # completed with no announcement seen: the span will say so
    session.feed(IN, build.announce_writer(A, W, "rt/odom", seq=7), 3)  # the resend
    [later] = started(session.feed(IN, build.sample(A, W, 3), 4))
    assert later.topic == "rt/odom"


def test_retransmission_and_one_send_per_reader_are_not_new_messages():
    detector, session = new_session()
    other_flow = detector.new_session(OUT)
    assert len(started(session.feed(OUT, build.sample(A, W, 1), 1))) == 1
    assert started(other_flow.feed(OUT, build.sample(A, W, 1), 2)) == []  # same sample to a second reader
    assert started(session.feed(OUT, build.sample(A, W, 1), 3)) == []  # reliable repair
    assert detector.state.repeats == 2
    receiving = detector.new_session(IN)
    assert len(started(receiving.feed(IN, build.sample(A, W, 1), 4))) == 1
    assert started(receiving.feed(IN, build.sample(A, W, 1), 5)) == []


def test_a_repaired_hole_is_a_new_sample_and_not_lost():
    _, session = new_session()
    session.feed(IN, build.sample(A, W, 1), 1)
    session.feed(IN, build.sample(A, W, 3), 2)
    [repaired] = started(session.feed(IN, build.sample(A, W, 2), 3))
    assert repaired.sequence == 2
    later = []
    for seq in range(4, 4 + LOSS_HORIZON + 2):
        later += started(session.feed(IN, build.sample(A, W, seq), seq))
    assert sum(e.lost_before for e in later) == 0


def test_samples_before_the_first_one_seen_are_new_when_repaired_and_never_lost():
    """The first datagrams were dropped and repaired after a later sample
    arrived (or the agent started after them): not repeats, not losses."""
    _, session = new_session()
    session.feed(IN, build.sample(A, W, 3), 1)
    assert [e.sequence for e in started(session.feed(IN, build.sample(A, W, 1), 2))] == [1]
    assert started(session.feed(IN, build.sample(A, W, 1), 3)) == []  # and its repeat is a repeat
    later = []
    for seq in range(4, 4 + LOSS_HORIZON + 2):  # 2 never arrives: unknown, not lost
        later += started(session.feed(IN, build.sample(A, W, seq), seq + 3))
    assert sum(e.lost_before for e in later) == 0
    _, late_agent = new_session()
    [first] = started(late_agent.feed(IN, build.sample(A, W, 5000), 1))
    assert first.lost_before == 0
    for seq in range(5001, 5001 + LOSS_HORIZON + 2):
        assert all(e.lost_before == 0 for e in started(late_agent.feed(IN, build.sample(A, W, seq), seq)))


def test_gaps_never_filled_are_lost_and_reported_once():
    _, session = new_session()
    session.feed(IN, build.sample(A, W, 1), 1)
    session.feed(IN, build.sample(A, W, 4), 2)  # 2 and 3 missing
    session.feed(IN, build.header(A) + build.heartbeat(W, 4, 4), 3)  # the writer no longer has them
    [after] = started(session.feed(IN, build.sample(A, W, 5), 4))
    assert after.lost_before == 2
    [next_one] = started(session.feed(IN, build.sample(A, W, 6), 5))
    assert next_one.lost_before == 0


def test_gap_submessage_marks_irrelevant_not_lost():
    _, session = new_session()
    session.feed(IN, build.sample(A, W, 1), 1)
    session.feed(IN, build.sample(A, W, 4), 2)
    session.feed(IN, build.header(A) + build.gap(W, 2, 4, []), 3)
    session.feed(IN, build.header(A) + build.heartbeat(W, 4, 4), 4)
    [after] = started(session.feed(IN, build.sample(A, W, 5), 5))
    assert after.lost_before == 0


def test_horizon_declares_loss_for_best_effort_writers():
    _, session = new_session()
    session.feed(IN, build.sample(A, W, 1), 1)
    exchanges = []
    for seq in range(3, 3 + LOSS_HORIZON + 1):
        exchanges += started(session.feed(IN, build.sample(A, W, seq), seq))
    assert sum(e.lost_before for e in exchanges) == 1


def test_fragments_reassemble_into_one_sample_in_any_order():
    _, session = new_session()
    size, frag = 2500, 1000
    pieces = [(1, b"a" * 1000), (3, b"c" * 500), (2, b"b" * 1000)]
    events = []
    for first, chunk in pieces:
        stamp = build.info_ts(5_000) if first == 1 else b""  # only the first datagram carries INFO_TS
        events += session.feed(IN, build.header(A) + stamp + build.data_frag(W, 7, first, chunk, frag, size), first)
    [exchange] = started(events)
    assert (exchange.sequence, exchange.size, exchange.fragmented, exchange.source_ns) == (7, 2500, True, 5_000)


def test_discovery_can_arrive_fragmented():
    detector, session = new_session()
    payload = build.announcement(WRITER, "rt/big_topic_name", "pkg::msg::dds_::Big_")
    from protocols.rtps.discovery import SEDP_PUBLICATIONS_WRITER

    half = 40
    session.feed(IN, build.header(A) + build.data_frag(SEDP_PUBLICATIONS_WRITER, 1, 2, payload[half:], half * 4, len(payload)), 1)
    assert detector.state.directory.endpoint(WRITER) is None
    frag_size = half
    events = []
    for number in range(1, -(-len(payload) // frag_size) + 1):
        chunk = payload[(number - 1) * frag_size : number * frag_size]
        events += session.feed(IN, build.header(A) + build.data_frag(SEDP_PUBLICATIONS_WRITER, 2, number, chunk, frag_size, len(payload)), 2)
    assert events == []
    assert detector.state.directory.endpoint(WRITER).topic == "rt/big_topic_name"


def test_ros2_service_request_is_client_where_sent_and_server_where_received():
    detector, session = new_session()
    session.feed(IN, build.announce_writer(A, W, "rq/add_two_intsRequest"), 1)
    [sent] = started(detector.new_session(OUT).feed(OUT, build.sample(A, W, 1), 2))
    [got] = started(session.feed(IN, build.sample(A, W, 1), 3))
    assert (sent.kind, got.kind) == (ExchangeKind.CLIENT, ExchangeKind.SERVER)


def test_malformed_datagrams_are_counted_not_raised():
    _, session = new_session()
    assert session.feed(IN, b"RTPS\x02\x01" + b"\0" * 14 + b"\x07\x01\x08\x00" + b"\0" * 8, 1) == []
    assert session.parse_errors == 1


def test_guid_text():
    assert guid_text(WRITER) == "0110aaaa.00000000.0000000a.00000103"


def test_discovery_without_data_gives_one_notice_per_process():
    from protocols.rtps.state import QUIET_NS

    detector = RtpsDetector()
    talker = detector.new_session(OUT)
    talker.pid = 41
    listener = detector.new_session(IN)
    listener.pid = 42
    listener.feed(IN, build.announce_reader(B, build.USER_READER, "rt/chatter"), 0)
    talker.feed(OUT, build.announce_writer(A, W, "rt/chatter"), 1)  # its own announcement leaves its socket
    talker.feed(OUT, build.header(A) + build.heartbeat(W, 1, 0), QUIET_NS // 2)
    assert detector.take_notices() == []
    talker.feed(OUT, build.header(A) + build.heartbeat(W, 1, 0), QUIET_NS + 2)
    [notice] = detector.take_notices()
    assert "DDS process 41" in notice and "rt/chatter" in notice and "shared memory" in notice
    talker.feed(OUT, build.header(A) + build.heartbeat(W, 1, 0), 3 * QUIET_NS)
    assert detector.take_notices() == []  # once


def test_a_process_whose_samples_cross_sockets_gets_no_notice():
    from protocols.rtps.state import QUIET_NS

    detector = RtpsDetector()
    talker = detector.new_session(OUT)
    talker.pid = 41
    detector.new_session(IN).feed(IN, build.announce_reader(B, build.USER_READER, "rt/chatter"), 0)
    talker.feed(OUT, build.announce_writer(A, W, "rt/chatter"), 1)
    talker.feed(OUT, build.sample(A, W, 1), 2)
    talker.feed(OUT, build.header(A) + build.heartbeat(W, 1, 1), 2 * QUIET_NS)
    assert detector.take_notices() == []


def test_a_process_counts_a_sample_once_whichever_socket_brings_it_and_ignores_its_own_multicast():
    detector = RtpsDetector()
    multicast, unicast = detector.new_session(IN), detector.new_session(IN)
    multicast.pid = unicast.pid = 7
    assert len(started(multicast.feed(IN, build.sample(A, W, 1), 1))) == 1
    assert started(unicast.feed(IN, build.sample(A, W, 1), 2)) == []
    writer = detector.new_session(OUT)
    writer.pid = 9
    writer.feed(OUT, build.sample(A, W, 2), 3)  # process 9 sends as participant A
    echo = detector.new_session(IN)
    echo.pid = 9
    assert started(echo.feed(IN, build.sample(A, W, 2), 4)) == []
    assert len(started(multicast.feed(IN, build.sample(A, W, 2), 5))) == 1
