"""The frames the session skips unparsed (PING, WINDOW_UPDATE, PRIORITY, SETTINGS ACK,
extension types) are judged as hyperframe judges them, so that skipping them changes no
error count; and skipping them changes no span."""

from __future__ import annotations

import itertools
import random
import struct

from hyperframe.frame import Frame

from protocols.base import Direction, ExchangeStarted
from protocols.http2 import frames as fr
from protocols.http2.stitch import Http2Session
from protocols.http2.types import PREFACE


def _frame(length: int, frame_type: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return struct.pack(">I", length)[1:] + bytes([frame_type, flags]) + struct.pack(">I", stream_id) + payload


def _hyperframe_accepts(raw: bytes) -> bool:
    view = memoryview(raw)
    try:
        frame, length = Frame.parse_frame_header(view[: fr.HEADER_LEN])
        frame.parse_body(view[fr.HEADER_LEN : fr.HEADER_LEN + length])
    except Exception:  # noqa: BLE001 - any refusal
        return False
    return True


def test_the_unread_frames_verdict_is_hyperframes() -> None:
    rng = random.Random(7)
    judged = 0
    cases = itertools.product(
        (fr.PRIORITY, fr.PING, fr.WINDOW_UPDATE, fr.SETTINGS, 0x0B, 0xFF),
        (0, fr.FLAG_ACK, 0x80),
        (0, 3, 4, 5, 7, 8, 9),
        (0, 1, 0x7FFFFFFF),
    )
    for frame_type, flags, length, stream_id in cases:
        for payload in (bytes(length), bytes(rng.randrange(256) for _ in range(length)), b"\x80" + bytes(max(0, length - 1))):
            payload = payload[:length]
            raw = _frame(length, frame_type, flags, stream_id, payload)
            verdict = fr.check_unread(raw, length, frame_type, flags, stream_id)
            if verdict is None:
                assert frame_type == fr.SETTINGS and not flags & fr.FLAG_ACK
                continue
            judged += 1
            assert verdict == _hyperframe_accepts(raw), (frame_type, flags, length, stream_id, payload)
    assert judged > 300


def _session_errors_and_starts(frames: list[bytes]) -> tuple[int, int]:
    session = Http2Session(Direction.INGRESS)
    out = session.feed(Direction.INGRESS, PREFACE + b"".join(frames), 1)
    return session.parse_errors, sum(isinstance(event, ExchangeStarted) for event in out)


def test_skipped_frames_count_their_errors_and_leave_the_exchange_alone() -> None:
    # GET / over http on stream 1 (HPACK static-table indices 2, 4, 6), with well-formed
    # and malformed skipped frames before it.
    request = _frame(3, fr.HEADERS, fr.FLAG_END_HEADERS | fr.FLAG_END_STREAM, 1, b"\x82\x84\x86")
    ping_ok = _frame(8, fr.PING, 0, 0, bytes(8))
    ping_on_stream = _frame(8, fr.PING, 0, 3, bytes(8))
    window_zero = _frame(4, fr.WINDOW_UPDATE, 0, 1, bytes(4))
    extension = _frame(2, 0x0B, 0, 0, b"hi")
    assert _session_errors_and_starts([ping_ok, extension, request]) == (0, 1)
    assert _session_errors_and_starts([ping_on_stream, window_zero, request]) == (2, 1)
