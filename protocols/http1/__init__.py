"""HTTP/1.x: detector, per-direction parser and request/response stitcher."""

from protocols.http1.detect import Http1Detector
from protocols.http1.parse import BodyData, HeadComplete, HttpParser, MessageComplete, ParserEvent
from protocols.http1.stitch import Http1Session
from protocols.http1.types import PROTOCOL, HttpExchange, HttpRequest, HttpResponse

HTTP1_DETECTOR = Http1Detector()

__all__ = [
    "HTTP1_DETECTOR",
    "PROTOCOL",
    "BodyData",
    "HeadComplete",
    "Http1Detector",
    "Http1Session",
    "HttpExchange",
    "HttpParser",
    "HttpRequest",
    "HttpResponse",
    "MessageComplete",
    "ParserEvent",
]
