"""Recognises HTTP/2 from the first bytes of a connection, by content alone.

Three openings:

* the client connection preface (``PRI * HTTP/2.0...``): prior knowledge;
* an HTTP/1.1 request with ``Upgrade: h2c``;
* frames, for a connection that began before the agent: the bytes must be a
  run of frame headers that obey the per-type rules (type, flags, stream 0
  or not, fixed lengths; ``frames.plausible``). Which side is the client is
  read from the first header block when one is there (request
  pseudo-headers or ``:status``, decodable from the static table and
  literals even without the HPACK state); the session confirms it.

TLS records and HTTP/1 text fail the frame rules at once (their first three
bytes, read as a frame length, exceed 16 KiB).
"""

from __future__ import annotations

import re

from protocols.base import Detector, Direction, ProgressFilter, Transport
from protocols.http2 import frames as fr
from protocols.http2.hpack_state import TolerantDecoder
from protocols.http2.stitch import Http2Session
from protocols.http2.types import PREFACE, PROTOCOL

_UPGRADE_H2C = re.compile(rb"\r\nupgrade:[ \t]*h2c[ \t]*\r\n", re.IGNORECASE)
from protocols.http2.stitch import REQUEST_LINE as _REQUEST_LINE
_REQUEST_PSEUDO = (":method", ":path", ":scheme", ":authority")
#: Frames a late-joined run must show before the detector believes it.
_MIN_FRAMES = 1


class Http2Detector(Detector):
    """The detector of HTTP/2 over cleartext (and TLS plaintext).

    Registered before HTTP/1's so that an ``Upgrade: h2c`` request is HTTP/2's.
    """

    protocol = PROTOCOL
    transports = Transport.STREAM

    def __init__(self, report_progress: bool = False, progress_filter: ProgressFilter | None = None) -> None:
        self.report_progress = report_progress
        self.progress_filter = progress_filter

    def detect(self, direction: Direction, data: bytes) -> Direction | None:
        if data.startswith(PREFACE[: len(data)]):
            return direction if len(data) >= len(PREFACE) else None
        if data[:1].isalpha():
            if _REQUEST_LINE.match(data) and _UPGRADE_H2C.search(data.partition(b"\r\n\r\n")[0] + b"\r\n"):
                return direction
            return None
        ok, frames = fr.frames_plausible(data, _MIN_FRAMES)
        if not ok:
            return None
        return _role_from_headers(data, frames, direction)

    def new_session(self, request_direction: Direction) -> Http2Session:
        return Http2Session(request_direction, progress=self.report_progress, progress_filter=self.progress_filter)


def _role_from_headers(data: bytes, frames, direction: Direction) -> Direction:
    """The request direction, from the first HEADERS frame's decodable fields; else a guess
    (``direction``), which the session corrects from the first header block it can read."""
    for offset, length, frame_type, flags, _stream in frames:
        if frame_type != fr.HEADERS:
            continue
        start = offset + fr.HEADER_LEN
        payload = data[start : start + length]
        pad = 0
        if flags & fr.FLAG_PADDED and payload:
            pad = payload[0]
            payload = payload[1:]
        if flags & fr.FLAG_PRIORITY:
            payload = payload[5:]
        if pad:
            payload = payload[:-pad]
        names = {name for name, _ in TolerantDecoder(complete=False).decode(payload).headers}
        if names.intersection(_REQUEST_PSEUDO):
            return direction
        if ":status" in names:
            return direction.opposite
    return direction
