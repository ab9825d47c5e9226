"""HTTP/2 test traffic: a real grpcio capture, and frames built with hyperframe + hpack."""

from __future__ import annotations

import json
from pathlib import Path

from hpack import Encoder
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    GoAwayFrame,
    HeadersFrame,
    RstStreamFrame,
    SettingsFrame,
)

from protocols.base import Direction, ExchangeAbandoned, ExchangeCompleted, ExchangeStarted
from protocols.http2.types import PREFACE

HERE = Path(__file__).parent

#: grpcio 1.85 client and server (examples/grpc_service.py "call --mode all"),
#: recorded by a TCP proxy: (0 = client to server, ns since the first write, bytes).
#: Streams 1 Predict, 3 StreamTokens, 5 Upload, 7 Chat, 9 Predict -> NOT_FOUND (Trailers-Only).
GRPC_ALL: list[tuple[int, int, bytes]] = [
    (d, ts, bytes.fromhex(h)) for d, ts, h in json.loads((HERE / "grpc_all.json").read_text())
]


def as_seen_by(capture, side: str) -> list[tuple[Direction, bytes, int]]:
    """The capture from the client's or the server's process: (direction, bytes, ts)."""
    out = []
    for to_server, ts, data in capture:
        client_wrote = to_server == 0
        egress = client_wrote if side == "client" else not client_wrote
        out.append((Direction.EGRESS if egress else Direction.INGRESS, data, ts + 1_000_000))
    return out


def run(session, chunks, close_ns: int | None = None) -> list:
    events = []
    for direction, data, ts in chunks:
        events.extend(session.feed(direction, data, ts))
    if close_ns is not None:
        events.extend(session.close(close_ns))
    return events


def exchanges(events) -> list:
    """Exchanges that ended, in end order."""
    return [e.exchange for e in events if isinstance(e, (ExchangeCompleted, ExchangeAbandoned))]


def started(events) -> list:
    return [e.exchange for e in events if isinstance(e, ExchangeStarted)]


class Conversation:
    """Builds both directions of an HTTP/2 connection frame by frame."""

    def __init__(self, preface: bool = True) -> None:
        self.client_encoder = Encoder()
        self.server_encoder = Encoder()
        self.client = bytearray(PREFACE if preface else b"")
        self.server = bytearray()
        if preface:
            self.client += SettingsFrame(0).serialize()
            self.server += SettingsFrame(0).serialize()

    def request(self, stream_id: int, headers, end_stream: bool = False, split: int = 0) -> None:
        block = self.client_encoder.encode(headers)
        self.client += _headers(stream_id, block, end_stream, split)

    def response(self, stream_id: int, headers, end_stream: bool = False) -> None:
        block = self.server_encoder.encode(headers)
        self.server += _headers(stream_id, block, end_stream, 0)

    def data(self, to_server: bool, stream_id: int, payload: bytes, end_stream: bool = False) -> None:
        frame = DataFrame(stream_id, payload, flags=["END_STREAM"] if end_stream else [])
        (self.client if to_server else self.server).extend(frame.serialize())

    def reset(self, to_server: bool, stream_id: int, code: int = 8) -> None:
        (self.client if to_server else self.server).extend(RstStreamFrame(stream_id, error_code=code).serialize())

    def goaway(self, last_stream_id: int) -> None:
        self.server += GoAwayFrame(0, last_stream_id=last_stream_id, error_code=0).serialize()


def _headers(stream_id: int, block: bytes, end_stream: bool, split: int) -> bytes:
    flags = ["END_STREAM"] if end_stream else []
    if not split:
        return HeadersFrame(stream_id, block, flags=flags + ["END_HEADERS"]).serialize()
    first = HeadersFrame(stream_id, block[:split], flags=flags).serialize()
    rest = ContinuationFrame(stream_id, block[split:], flags=["END_HEADERS"]).serialize()
    return first + rest


def grpc_message(payload: bytes) -> bytes:
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


GRPC_REQUEST = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/pkg.Svc/Get"),
    (":authority", "svc:50051"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]
