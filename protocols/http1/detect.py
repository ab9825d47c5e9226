"""Recognises HTTP/1.x from the first bytes of a connection, by content alone.

Runs on the first chunk of every new connection, so it is one anchored
regex match over at most a few KiB: no decoding, no header parsing.
"""

from __future__ import annotations

from protocols.base import Detector, Direction, ProgressFilter, Transport
from protocols.http1.parse import looks_like_request_start, looks_like_response_start
from protocols.http1.stitch import Http1Session
from protocols.http1.types import PROTOCOL


class Http1Detector(Detector):
    """The detector of HTTP/1.0 and HTTP/1.1.

    A request line (a standard method, or any token method followed by a
    target and `` HTTP/1.x``) means ``direction`` carries requests; a status
    line ``HTTP/1.x NNN`` means requests go the other way. The HTTP/2
    preface (``PRI * HTTP/2.0``), TLS records and binary data match neither.

    ``body_limit``: bytes of each body its sessions keep on the messages (the
    agent keeps none: HTTP/1 spans need only sizes). ``report_progress``:
    whether its sessions report ``ExchangeProgress`` (first response byte,
    body chunks); the pipeline turns it on when something observes them.
    ``progress_filter``: which exchanges report it (base.py), None for all.
    """

    protocol = PROTOCOL
    transports = Transport.STREAM

    def __init__(
        self, body_limit: int = 0, report_progress: bool = False, progress_filter: ProgressFilter | None = None
    ) -> None:
        self.body_limit = body_limit
        self.report_progress = report_progress
        self.progress_filter = progress_filter

    def detect(self, direction: Direction, data: bytes) -> Direction | None:
        if looks_like_request_start(data):
            return direction
        if looks_like_response_start(data):
            return direction.opposite
        return None

    def new_session(self, request_direction: Direction) -> Http1Session:
        return Http1Session(
            request_direction,
            body_limit=self.body_limit,
            progress=self.report_progress,
            progress_filter=self.progress_filter,
        )
