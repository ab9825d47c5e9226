"""The RTPS wire decoder on messages built from the spec, in both endiannesses."""

from __future__ import annotations

import pytest

from protocols.rtps import wire
from protocols.rtps.tests import build

ENDIANNESS = pytest.mark.parametrize("little", [True, False], ids=["little", "big"])


def test_header_fields():
    message = wire.parse_message(build.header(build.PREFIX_B, b"\x01\x0f"))
    assert message.header.version == (2, 1)
    assert message.header.vendor_id == b"\x01\x0f"
    assert message.header.guid_prefix == build.PREFIX_B
    assert message.submessages == []


@pytest.mark.parametrize("data", [b"", b"RTPX" + b"\0" * 16, b"RTPS\x01\x00" + b"\0" * 14, b"RTPS"])
def test_not_rtps_raises_rtps_error(data):
    with pytest.raises(wire.RtpsError):
        wire.parse_message(data)


@ENDIANNESS
def test_info_ts_info_dst_data(little):
    ts = 1_700_000_000_123_456_789
    raw = (
        build.header()
        + build.info_dst(build.PREFIX_B, little)
        + build.info_ts(ts, little)
        + build.data(build.USER_WRITER, (5 << 32) + 7, b"\x00\x01\x00\x00abc", little)
    )
    dst, when, data = wire.parse_message(raw).submessages
    assert dst.guid_prefix == build.PREFIX_B
    assert when.time_ns == ts
    assert (data.writer_id, data.sequence, data.payload) == (build.USER_WRITER, (5 << 32) + 7, b"\x00\x01\x00\x00abc")
    assert data.little_endian is little and not data.fragmented


@ENDIANNESS
def test_inline_qos_is_skipped_to_the_payload(little):
    qos = build.parameter(wire.PID_KEY_HASH, b"k" * 16, little) + build.parameter(wire.PID_SENTINEL, b"", little)
    raw = build.header() + build.data(build.USER_WRITER, 1, b"\x00\x01\x00\x00xyz!", little, qos=qos)
    [data] = wire.parse_message(raw).submessages
    assert data.payload == b"\x00\x01\x00\x00xyz!"
    assert wire.parameters(data.inline_qos, little) == [(wire.PID_KEY_HASH, b"k" * 16)]


@ENDIANNESS
def test_data_frag_fields(little):
    raw = build.header() + build.data_frag(build.USER_WRITER, 9, 3, b"f" * 200, 100, 1000, little)
    [frag] = wire.parse_message(raw).submessages
    assert frag.fragmented
    assert (frag.sequence, frag.fragment_start, frag.fragments, frag.fragment_size, frag.sample_size) == (9, 3, 2, 100, 1000)
    assert frag.payload == b"f" * 200


@ENDIANNESS
def test_heartbeat_acknack_gap(little):
    raw = (
        build.header()
        + build.heartbeat(build.USER_WRITER, 3, 40, little)
        + build.acknack(build.USER_WRITER, 10, [10, 12, 45], little)
        + build.gap(build.USER_WRITER, 5, 8, [9], little)
    )
    beat, ack, gap = wire.parse_message(raw).submessages
    assert (beat.first, beat.last) == (3, 40)
    assert (ack.base, ack.missing, ack.count) == (10, [10, 12, 45], 3)
    assert (gap.start, gap.irrelevant) == (5, [5, 6, 7, 9])


def test_mixed_endianness_in_one_message():
    raw = build.header() + build.info_ts(2_000_000_000, False) + build.data(build.USER_WRITER, 2, b"\x00\x01\x00\x00", True)
    when, data = wire.parse_message(raw).submessages
    assert when.time_ns == 2_000_000_000 and data.sequence == 2


def test_unknown_submessages_are_skipped_by_length():
    raw = build.header() + build.submessage(0x7F, b"\0" * 8) + build.data(build.USER_WRITER, 1, b"\x00\x01\x00\x00")
    message = wire.parse_message(raw)
    assert [type(s).__name__ for s in message.submessages] == ["DataSubmessage"]
    assert message.skipped == 1


def test_truncated_capture_keeps_the_data_header_and_counts_the_rest():
    raw = build.header() + build.data(build.USER_WRITER, 4, b"\x00\x01\x00\x00" + b"p" * 400)
    cut = raw[:100]
    [data] = wire.parse_message(cut, missing=len(raw) - 100).submessages
    assert data.sequence == 4 and data.missing == len(raw) - 100


def test_length_past_the_end_of_a_whole_datagram_is_an_error():
    raw = build.header() + build.submessage(wire.HEARTBEAT, b"\0" * 8)  # a heartbeat needs 28 bytes
    with pytest.raises(wire.RtpsError):
        wire.parse_message(raw)


def test_time_conversion_round_trips():
    for ns in (0, 1, 999_999_999, 1_700_000_000_000_000_001):
        seconds, fraction = wire.time_ns_to_rtps(ns)
        raw = build.header() + build.submessage(wire.INFO_TS, seconds.to_bytes(4, "little") + fraction.to_bytes(4, "little"))
        assert wire.parse_message(raw).submessages[0].time_ns == ns


@pytest.mark.parametrize("value", [b"", b"\x05", b"\x05\x00\x00"])
def test_a_string_parameter_shorter_than_its_length_word_is_malformed_input(value: bytes) -> None:
    """A damaged discovery announcement whose topic or type name parameter is cut (hypothesis
    found one with an empty type name) is an RtpsError the directory counts, not a struct.error."""
    with pytest.raises(wire.RtpsError):
        wire.cdr_string(value, little=True)
