"""What Fast DDS (eProsima) puts on the wire that Cyclone DDS does not.

Seen in captures of examples/fastdds (Fast DDS 2.9, tests/golden/rtps/fastdds_*.pcap):
every message ends with a vendor-specific submessage (0x80, 56 bytes of
statistics), samples up to ~64 KB cross as one DATA (Cyclone fragments above
~1300 bytes) and larger ones as DATA_FRAG of 65324-byte fragments with a
HEARTBEAT after the last, and its SPDP announces a shared-memory locator
(kind 16) when the default transports are on.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols.base import Direction, ExchangeStarted
from protocols.rtps import RtpsDetector, wire
from protocols.rtps.discovery import SPDP_WRITER, Directory
from protocols.rtps.state import QUIET_NS
from protocols.rtps.tests import build

IN, OUT = Direction.INGRESS, Direction.EGRESS
FAST_DDS = b"\x01\x0f"
A = bytes.fromhex("010f78fd3658061e00000000")
B = bytes.fromhex("010f78fd6b593c2900000000")
W = build.USER_WRITER


def statistics_submessage(little: bool = True) -> bytes:
    return build.submessage(0x80, b"\x5a" * 56, little)


def locator(kind: int, port: int, little: bool = True) -> bytes:
    return struct.pack("<iI" if little else ">iI", kind, port) + b"\0" * 12 + bytes([127, 0, 0, 1])


def spdp(prefix: bytes, kinds: list[int], little: bool = True) -> bytes:
    """A Fast DDS SPDP announcement with one default unicast locator per kind."""
    params = build.parameter(wire.PID_PARTICIPANT_GUID, prefix + bytes.fromhex("000001c1"), little)
    for number, kind in enumerate(kinds):
        params += build.parameter(wire.PID_DEFAULT_UNICAST_LOCATOR, locator(kind, 7411 + number, little), little)
    params += struct.pack("<HH" if little else ">HH", wire.PID_SENTINEL, 0)
    payload = (b"\x00\x03" if little else b"\x00\x02") + b"\0\0" + params
    return build.header(prefix, FAST_DDS) + build.info_ts(1) + build.data(SPDP_WRITER, 1, payload, little)


@pytest.mark.parametrize("little", [True, False])
def test_vendor_specific_submessages_are_passed_over_without_counting_them(little):
    raw = build.header(A, FAST_DDS) + build.data(W, 1, b"\x00\x01\x00\x00xy", little) + statistics_submessage(little)
    message = wire.parse_message(raw)
    assert [type(s).__name__ for s in message.submessages] == ["DataSubmessage"]
    assert message.skipped == 0
    assert message.header.vendor_id == FAST_DDS


def test_vendor_names():
    assert wire.vendor_name(FAST_DDS) == "eProsima Fast DDS"
    assert wire.vendor_name(b"\x01\x10") == "Eclipse Cyclone DDS"
    assert wire.vendor_name(b"\x0a\xbc") == "0x0abc"


@pytest.mark.parametrize("little", [True, False])
def test_spdp_with_a_shared_memory_locator_is_remembered_per_participant(little):
    directory = Directory()
    for prefix, kinds in ((A, [16, 1]), (B, [1])):
        [data] = [s for s in wire.parse_message(spdp(prefix, kinds, little)).submessages if type(s) is wire.DataSubmessage]
        directory.learn(prefix, data, data.payload, 0)
    assert directory.announces_shared_memory(A) and not directory.announces_shared_memory(B)
    assert directory.shared_memory_peers(B) == 1 and directory.shared_memory_peers(A) == 0
    assert directory.errors == 0


def test_a_participant_that_drops_shared_memory_is_forgotten():
    directory = Directory()
    for kinds in ([16, 1], [1]):
        [data] = [s for s in wire.parse_message(spdp(A, kinds)).submessages if type(s) is wire.DataSubmessage]
        directory.learn(A, data, data.payload, 0)
    assert not directory.announces_shared_memory(A)


def test_shared_memory_pair_whose_samples_never_cross_a_socket_gives_one_notice():
    """Fast DDS's default transports: SPDP goes by UDP multicast, SEDP and the
    samples by shared memory, so no writer announcement is ever seen."""
    detector = RtpsDetector()
    talker, listener = detector.new_session(OUT), detector.new_session(OUT)
    talker.pid, listener.pid = 41, 42
    listener.feed(OUT, spdp(B, [16, 1]), 0)
    talker.feed(OUT, spdp(A, [16, 1]), 1)
    talker.feed(OUT, spdp(A, [16, 1]), QUIET_NS // 2)
    assert detector.take_notices() == []
    talker.feed(OUT, spdp(A, [16, 1]), QUIET_NS + 2)
    notices = detector.take_notices()
    assert any("DDS process 41" in n and "shared memory" in n for n in notices), notices
    talker.feed(OUT, spdp(A, [16, 1]), 3 * QUIET_NS)
    assert not any("DDS process 41" in n for n in detector.take_notices())  # once


def test_shared_memory_participant_alone_or_sending_samples_gets_no_notice():
    detector = RtpsDetector()
    alone = detector.new_session(OUT)
    alone.pid = 41
    alone.feed(OUT, spdp(A, [16, 1]), 0)
    alone.feed(OUT, spdp(A, [16, 1]), 2 * QUIET_NS)
    assert detector.take_notices() == []  # no other participant offers shared memory
    detector.new_session(OUT).feed(OUT, spdp(B, [16, 1]), 2 * QUIET_NS)
    alone.feed(OUT, build.header(A, FAST_DDS) + build.data(W, 1, b"\x00\x01\x00\x00xy"), 2 * QUIET_NS + 1)
    alone.feed(OUT, spdp(A, [16, 1]), 4 * QUIET_NS)
    assert detector.take_notices() == []  # its samples cross a socket: UDP is in use


def test_one_datagram_sample_of_64_kilobytes_and_fragments_with_a_trailing_heartbeat():
    detector = RtpsDetector()
    session = detector.new_session(IN)
    big = b"\x00\x01\x00\x00" + b"7" * 60000
    events = session.feed(IN, build.header(A, FAST_DDS) + build.info_ts(5) + build.data(W, 1, big) + statistics_submessage(), 10)
    [one] = [e.exchange for e in events if type(e) is ExchangeStarted]
    assert one.size == len(big) and not one.fragmented and one.vendor_id == FAST_DDS
    sample_size, fragment = 100024, 65324
    first = build.data_frag(W, 2, 1, b"f" * fragment, fragment, sample_size)
    last = build.data_frag(W, 2, 2, b"f" * (sample_size - fragment), fragment, sample_size) + build.heartbeat(W, 1, 2)
    assert session.feed(IN, build.header(A, FAST_DDS) + build.info_dst(B) + build.info_ts(6) + first, 11) == []
    events = session.feed(IN, build.header(A, FAST_DDS) + build.info_dst(B) + build.info_ts(6) + last, 12)
    [whole] = [e.exchange for e in events if type(e) is ExchangeStarted]
    assert whole.size == sample_size and whole.fragmented and whole.sequence == 2
    assert session.parse_errors == 0


@pytest.mark.parametrize("key_in", ["key hash", "payload"])
def test_a_reader_disposed_by_key_hash_or_by_serialized_key_is_forgotten(key_in):
    """Fast DDS names the disposed endpoint in PID_KEY_HASH; Cyclone DDS only in
    its serialized key (PID_ENDPOINT_GUID): either way it stops counting as a reader."""
    from protocols.rtps.discovery import SEDP_SUBSCRIPTIONS_WRITER

    detector = RtpsDetector()
    session = detector.new_session(IN)
    reader = B + build.USER_READER
    session.feed(IN, build.announce_reader(B, build.USER_READER, "rt/camera/image"), 1)
    assert detector.state.directory.readers("rt/camera/image") == 1
    status = build.parameter(wire.PID_STATUS_INFO, b"\0\0\0\x03", True)
    sentinel = struct.pack("<HH", wire.PID_SENTINEL, 0)
    if key_in == "key hash":
        qos, payload = build.parameter(wire.PID_KEY_HASH, reader, True) + status + sentinel, b""
    else:
        qos = status + sentinel
        payload = b"\x00\x03\x00\x00" + build.parameter(wire.PID_ENDPOINT_GUID, reader, True) + sentinel
    session.feed(IN, build.header(B) + build.data(SEDP_SUBSCRIPTIONS_WRITER, 2, payload, qos=qos), 2)
    assert detector.state.directory.readers("rt/camera/image") == 0
    assert detector.state.directory.errors == 0


def test_a_cut_spdp_announcement_keeps_what_was_known():
    directory = Directory()
    [data] = [s for s in wire.parse_message(spdp(A, [16, 1])).submessages if type(s) is wire.DataSubmessage]
    directory.learn(A, data, data.payload, 0)
    directory.learn(A, data, b"", 1)  # the session passes b"" when the capture cut the payload
    assert directory.announces_shared_memory(A)


FAST_DDS_VALID = [spdp(A, [16, 1]), spdp(B, [1], little=False), build.announce_reader(B, build.USER_READER, "rt/camera/image")]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(FAST_DDS_VALID), st.integers(20, 200), st.binary(min_size=1, max_size=6), st.booleans()
        ),
        max_size=12,
    )
)
def test_damaged_fastdds_discovery_is_survived(damaged):
    """SPDP locators and SEDP disposals from bytes overwritten anywhere: never an exception."""
    detector = RtpsDetector()
    session = detector.new_session(OUT)
    session.pid = 9
    for ts, (message, at, junk, egress) in enumerate(damaged):
        raw = message[:at] + junk + message[at + len(junk) :]
        session.feed(OUT if egress else IN, raw, ts * QUIET_NS)
    detector.take_notices()
