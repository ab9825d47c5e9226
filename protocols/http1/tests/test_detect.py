"""Http1Detector: recognise HTTP/1.x from a connection's first bytes."""

from __future__ import annotations

import pytest

from protocols.base import Direction, Transport
from protocols.http1 import HTTP1_DETECTOR, Http1Detector, Http1Session
from protocols.http1.parse import STANDARD_METHODS
from protocols.http1.tests.messages import CURL_GET, HTTP10_CLOSE_DELIMITED, NGINX_200, REQUESTS_POST

IN, OUT = Direction.INGRESS, Direction.EGRESS


@pytest.mark.parametrize("direction", [IN, OUT])
def test_request_line_means_requests_go_this_way(direction: Direction) -> None:
    assert HTTP1_DETECTOR.detect(direction, CURL_GET) is direction
    assert HTTP1_DETECTOR.detect(direction, REQUESTS_POST) is direction


@pytest.mark.parametrize("direction", [IN, OUT])
def test_status_line_means_requests_go_the_other_way(direction: Direction) -> None:
    assert HTTP1_DETECTOR.detect(direction, NGINX_200) is direction.opposite
    assert HTTP1_DETECTOR.detect(direction, HTTP10_CLOSE_DELIMITED) is direction.opposite


@pytest.mark.parametrize("method", sorted(STANDARD_METHODS))
def test_every_standard_method_is_accepted(method: str) -> None:
    target = b"example.com:443" if method == "CONNECT" else b"/path?q=1"
    assert HTTP1_DETECTOR.detect(IN, method.encode() + b" " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n") is IN


def test_standard_method_with_target_cut_by_the_capture_size_is_accepted() -> None:
    assert HTTP1_DETECTOR.detect(IN, b"GET /search?q=" + b"x" * 300) is IN


@pytest.mark.parametrize(
    "data",
    [b"PROPFIND /dav/file.txt HTTP/1.1\r\nDepth: 1\r\n\r\n", b"MKCOL /dav/new/ HTTP/1.1\r\n", b"PURGE /cache HTTP/1.0"],
)
def test_extension_methods_need_target_and_version(data: bytes) -> None:
    assert HTTP1_DETECTOR.detect(IN, data) is IN
    assert HTTP1_DETECTOR.detect(IN, data.split(b" HTTP/")[0]) is None


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",  # HTTP/2 prior-knowledge preface
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # TLS ClientHello
        b"\x17\x03\x03\x00\x45",  # TLS application data
        b"\x00\x00\x12\x04\x00\x00\x00\x00\x00",  # HTTP/2 SETTINGS frame
        b"*2\r\n$3\r\nGET\r\n$3\r\nfoo\r\n",  # Redis RESP
        b"GET foo\r\n",  # Redis inline command
        b"get mykey\r\n",  # memcached
        b"SSH-2.0-OpenSSH_9.6\r\n",
        b"\x00\x00\x00\x08\x04\xd2\x16\x2f",  # PostgreSQL SSLRequest
        b"HTTP/2 200\r\n",
        b"GET / HTTP/3\r\n",
        b"GET  / HTTP/1.1\r\n",
    ],
    ids=repr,
)
def test_other_protocols_and_junk_are_rejected(data: bytes) -> None:
    assert HTTP1_DETECTOR.detect(IN, data) is None


def test_new_session_carries_the_request_direction() -> None:
    session = Http1Detector().new_session(OUT)
    assert isinstance(session, Http1Session) and session.request_direction is OUT
    assert len(session.feed(OUT, CURL_GET, 1)) == 1


def test_detector_names_the_protocol_by_its_package() -> None:
    assert HTTP1_DETECTOR.protocol == "http1" == Http1Session(IN).protocol
    assert HTTP1_DETECTOR.transports == Transport.STREAM
