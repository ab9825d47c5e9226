"""AWS's binary event stream (protocols/genai/eventstream.py): the messages botocore's own
decoder reads, whatever the piece boundaries; CRC failures counted and never trusted; any
bytes survived, within bounds."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocols.genai.eventstream import EventStream, encode_message, parse_headers
from protocols.genai.tests.test_fuzz import FUZZ, split

botocore_eventstream = pytest.importorskip("botocore.eventstream")

EVENTS = [
    ({":event-type": "messageStart", ":content-type": "application/json", ":message-type": "event"}, b'{"role":"assistant"}'),
    ({":event-type": "contentBlockDelta", ":message-type": "event"}, b'{"contentBlockIndex":0,"delta":{"text":"hi"},"p":"ab"}'),
    ({":event-type": "metadata", ":message-type": "event"}, b'{"usage":{"inputTokens":3,"outputTokens":1}}'),
    ({":exception-type": "throttlingException", ":message-type": "exception"}, b'{"message":"slow down"}'),
    ({":event-type": "empty", ":message-type": "event"}, b""),
]
STREAM = b"".join(encode_message(headers, payload) for headers, payload in EVENTS)
NAMES = ["messageStart", "contentBlockDelta", "metadata", "exception:throttlingException", "empty"]


def decode(pieces, **kwargs):
    stream = EventStream(**kwargs)
    out = []
    for piece in pieces:
        out += stream.feed(piece) if piece is not None else (stream.gap() or [])
    return out, stream


def test_botocore_reads_the_same_messages():
    buffer = botocore_eventstream.EventStreamBuffer()
    buffer.add_data(STREAM)
    theirs = [(message.headers, message.payload) for message in buffer]
    ours, stream = decode([STREAM])
    assert [(e.event, e.data) for e in ours] == list(zip(NAMES, [payload for _, payload in EVENTS]))
    assert [payload for _, payload in theirs] == [e.data for e in ours] and stream.errors == 0
    assert parse_headers(STREAM[12 : 12 + int.from_bytes(STREAM[4:8], "big")]) == EVENTS[0][0]


def test_a_bad_message_crc_drops_that_message_only():
    bad = bytearray(STREAM)
    first = int.from_bytes(STREAM[:4], "big")
    bad[first + 30] ^= 0x01  # inside the second message (headers or payload)
    events, stream = decode([bytes(bad)])
    assert [e.event for e in events] == [NAMES[0]] + NAMES[2:] and stream.errors == 1


def test_a_bad_prelude_loses_the_framing_until_the_next_valid_one():
    bad = bytearray(STREAM)
    bad[1] ^= 0x40  # the first message's total length: its prelude CRC fails
    events, stream = decode(split(bytes(bad), [5, 17, 40]))
    assert [e.event for e in events] == NAMES[1:] and stream.errors == 1


def test_a_hole_resumes_at_the_next_message():
    first = int.from_bytes(STREAM[:4], "big")
    events, stream = decode([STREAM[: first + 10], None, STREAM[first + 25 :]])
    # the first message came whole; the second was cut by the hole; the framing resumes at the third
    assert [e.event for e in events] == [NAMES[0]] + NAMES[2:] and stream.gaps == 1


def test_a_long_payload_keeps_its_head_and_tail():
    payload = b'{"text":"' + b"x" * 5000 + b'","usage":{"outputTokens":7}}'
    events, _ = decode([encode_message({":event-type": "metadata"}, payload)], payload_limit=100, tail=40)
    assert events[0].truncated and events[0].data == payload[:100] and events[0].tail == payload[-40:]


def test_lengths_beyond_aws_limits_are_not_trusted():
    prelude = (1 << 31).to_bytes(4, "big") + (0).to_bytes(4, "big")
    prelude += zlib.crc32(prelude).to_bytes(4, "big")
    events, stream = decode([prelude + STREAM])
    assert [e.event for e in events] == NAMES and stream.errors == 1


@FUZZ
@given(cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=20))
def test_chunking_never_changes_the_messages(cuts):
    whole, _ = decode([STREAM])
    pieces, stream = decode(split(STREAM, cuts))
    assert pieces == whole and stream.errors == 0


@FUZZ
@given(data=st.lists(st.one_of(st.binary(max_size=64), st.sampled_from([STREAM, STREAM[:30], STREAM[7:], b"\x00" * 16])),
                     max_size=8).map(b"".join),
       cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=10), gap=st.booleans())  # fmt: skip
def test_survives_anything_within_bounds(data, cuts, gap):
    stream = EventStream(payload_limit=64, tail=16)
    for i, piece in enumerate(split(data, cuts)):
        for event in stream.feed(piece):
            assert len(event.data) <= 64 and len(event.tail) <= 16
        assert stream.buffered <= 128 * 1024 + 64 + 16 + 16 + max(len(piece), 12)
        if gap and i == 1:
            stream.gap()
