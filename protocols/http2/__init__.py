"""HTTP/2 (h2c prior knowledge, Upgrade: h2c, connections joined late): detector, session, HPACK."""

from protocols.http2.detect import Http2Detector
from protocols.http2.hpack_state import DecodedBlock, TolerantDecoder
from protocols.http2.stitch import Http2Session
from protocols.http2.types import PREFACE, PROTOCOL, Http2Exchange, Http2Message

__all__ = [
    "PREFACE",
    "PROTOCOL",
    "DecodedBlock",
    "Http2Detector",
    "Http2Exchange",
    "Http2Message",
    "Http2Session",
    "TolerantDecoder",
]
