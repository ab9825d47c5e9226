"""HTTP/2 frame headers: reading them, and judging whether bytes look like frames.

Frame bodies are parsed by ``hyperframe``; this module only holds what the
detector and the session's resynchronisation need: the 9-byte header and the
per-type rules a real frame obeys (RFC 9113 section 6), so that a connection
joined mid-stream can be recognised from its frames, and so that random
binary data rarely passes for HTTP/2. And the check of the frames no span
reads (``check_unread``), which the session skips without building a frame.
"""

from __future__ import annotations

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
HEADER_LEN = 9
#: The largest frame we accept without the peer's SETTINGS (16 KiB default, 16 MiB max).
DEFAULT_MAX_FRAME = 16384
MAX_FRAME = (1 << 24) - 1

FLAG_END_STREAM = 0x1
FLAG_ACK = 0x1
FLAG_END_HEADERS = 0x4
FLAG_PADDED = 0x8
FLAG_PRIORITY = 0x20

#: Flags each frame type defines; any other bit set is suspicious in detection.
_KNOWN_FLAGS = {
    DATA: FLAG_END_STREAM | FLAG_PADDED,
    HEADERS: FLAG_END_STREAM | FLAG_END_HEADERS | FLAG_PADDED | FLAG_PRIORITY,
    PRIORITY: 0,
    RST_STREAM: 0,
    SETTINGS: FLAG_ACK,
    PUSH_PROMISE: FLAG_END_HEADERS | FLAG_PADDED,
    PING: FLAG_ACK,
    GOAWAY: 0,
    WINDOW_UPDATE: 0,
    CONTINUATION: FLAG_END_HEADERS,
}
_ON_STREAM = {DATA, HEADERS, PRIORITY, RST_STREAM, PUSH_PROMISE, CONTINUATION}
_ON_CONNECTION = {SETTINGS, PING, GOAWAY}
_FIXED_LENGTH = {PRIORITY: 5, RST_STREAM: 4, PING: 8, WINDOW_UPDATE: 4}


def check_unread(frame: bytes | bytearray, length: int, frame_type: int, flags: int, stream_id: int) -> bool | None:
    """For a whole frame (header and ``length`` payload bytes at the start of ``frame``) whose
    content no span needs (PING, WINDOW_UPDATE, PRIORITY, a SETTINGS acknowledgement, an
    extension type): whether it is well-formed, by the checks hyperframe makes of it (RFC 9113
    section 6), so that the session can count a malformed one and skip the rest without
    building a frame object (one per WINDOW_UPDATE and PING: gRPC sends many). None for every
    other frame: the session parses it."""
    if frame_type == WINDOW_UPDATE:
        if length != 4:
            return False
        # hyperframe reads the increment with the reserved bit, and wants 1 .. 2**31 - 1
        return 1 <= read_u32(frame, HEADER_LEN) <= 0x7FFFFFFF
    if frame_type == PING:
        return length == 8 and stream_id == 0
    if frame_type == PRIORITY:
        return length == 5 and stream_id != 0
    if frame_type == SETTINGS and flags & FLAG_ACK:
        return length == 0 and stream_id == 0
    if frame_type > CONTINUATION:
        return True  # an extension frame: ignored, as RFC 9113 section 5.5 says
    return None


def read_u32(data: bytes | bytearray | memoryview, pos: int) -> int:
    """The big-endian unsigned 32-bit integer at ``pos`` (4 bytes needed). Byte by byte: no
    slice and no int.from_bytes call; each byte a C int when compiled (frames.pxd), so the
    shifts and ors make no Python int objects. Frame headers, WINDOW_UPDATE increments and
    gRPC message lengths (stitch.py) are read with it."""
    b0, b1, b2, b3 = data[pos], data[pos + 1], data[pos + 2], data[pos + 3]
    return (b0 << 24) | (b1 << 16) | (b2 << 8) | b3


def read_header(data: bytes | memoryview, pos: int = 0) -> tuple[int, int, int, int]:
    """(length, type, flags, stream id) of the frame header at ``pos`` (9 bytes needed)."""
    length = read_u32(data, pos) >> 8  # 24 bits, then the type
    return length, data[pos + 3], data[pos + 4], read_u32(data, pos + 5) & 0x7FFFFFFF


def plausible(length: int, frame_type: int, flags: int, stream_id: int, max_frame: int = DEFAULT_MAX_FRAME) -> bool:
    """Whether a frame header obeys the rules a real one does (strict: for detection)."""
    known = _KNOWN_FLAGS.get(frame_type)
    if known is None or flags & ~known or length > max_frame:
        return False
    if frame_type in _ON_STREAM and stream_id == 0:
        return False
    if frame_type in _ON_CONNECTION and stream_id != 0:
        return False
    fixed = _FIXED_LENGTH.get(frame_type)
    if fixed is not None and length != fixed:
        return False
    if frame_type == SETTINGS and (length % 6 or (flags & FLAG_ACK and length)):
        return False
    if frame_type == GOAWAY and length < 8:
        return False
    return True


def frames_plausible(data: bytes, min_frames: int = 1) -> tuple[bool, list[tuple[int, int, int, int, int]]]:
    """Whether ``data`` is a run of plausible frames from its first byte.

    Returns (verdict, frames) where frames are (offset, length, type, flags,
    stream id) of the complete headers found. The run may end inside a
    frame's payload (a capture prefix), but not inside a header unless at
    least ``min_frames`` whole headers came before it.
    """
    frames: list[tuple[int, int, int, int, int]] = []
    pos = 0
    while pos + HEADER_LEN <= len(data):
        length, frame_type, flags, stream_id = read_header(data, pos)
        if not plausible(length, frame_type, flags, stream_id):
            return False, frames
        frames.append((pos, length, frame_type, flags, stream_id))
        pos += HEADER_LEN + length
    if pos < len(data) and len(frames) < min_frames:
        return False, frames  # a header cut short before any whole one
    return len(frames) >= min_frames, frames
