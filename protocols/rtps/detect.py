"""RTPS detection: a datagram that starts with the RTPS header."""

from __future__ import annotations

from protocols.base import Detector, Direction, Transport
from protocols.rtps.state import SharedState
from protocols.rtps.stitch import RtpsSession
from protocols.rtps.types import PROTOCOL
from protocols.rtps.wire import MAGIC


class RtpsDetector(Detector):
    """RTPS over UDP. Owns the state every session shares (discovery, sequence windows)."""

    protocol = PROTOCOL
    transports = Transport.DATAGRAM
    #: sessions watch DDS data per process (protocols/rtps/state.py, DataWatch)
    per_process_sessions = True

    def __init__(self, state: SharedState | None = None) -> None:
        self.state = state if state is not None else SharedState()

    def detect(self, direction: Direction, data: bytes) -> Direction | None:
        # "RTPS", major version 2: one-way messages, so "requests" are whatever moved first
        if len(data) >= 20 and data[:4] == MAGIC and data[4] == 2:
            return direction
        return None

    def new_session(self, request_direction: Direction) -> RtpsSession:
        return RtpsSession(self.state)

    def take_notices(self) -> list[str]:
        """Lines for the agent's log, each said once (protocols/rtps/state.py, DataWatch)."""
        return self.state.data_watch.take_notices()
