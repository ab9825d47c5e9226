"""Gathered writes through the real probes: sendmsg/writev with many iovecs.

The test process traces itself (EbpfSource in-process, --pid of its own pid)
and writes on a loopback TCP connection with sendmsg and writev of up to 64
iovecs (MAX_IOV; grpcio's first write on a channel has 25), of varied sizes.
The events must carry the bytes in order, whole when they fit the capture
size, cut at the capture size otherwise, and flagged IOV_TRUNCATED (with the
lost bytes counted) past the iovec bound. A readv/recvmsg into many buffers
takes the same loop.
"""

from __future__ import annotations

import os
import re
import socket
import time

import pytest

from conftest import ROOT

from otelbpf.events import DataEvent, DataFlags
from protocols.base import Direction

pytestmark = pytest.mark.ebpf

CAPTURE = 512
MAX_IOV = int(re.search(r"#define MAX_IOV (\d+)", (ROOT / "bpf" / "common.h").read_text()).group(1))


@pytest.fixture(scope="module")
def source():
    from otelbpf.sources.ebpf import CaptureConfig, EbpfSource

    src = EbpfSource(CaptureConfig(pids=[os.getpid()], capture_bytes=CAPTURE, python_tasks=False, capture_tls=False))
    src.start()
    yield src
    src.close()


def sends_on(source, fd: int, count: int, timeout: float = 5.0) -> list[DataEvent]:
    events: list[DataEvent] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(events) < count:
        events += [e for e in source.read() if type(e) is DataEvent and e.fd == fd and e.direction == Direction.EGRESS]
        time.sleep(0.02)
    return events


def pieces(count: int, size_of=lambda i: 1 + i % 7) -> list[bytes]:
    """``count`` iovecs of varied sizes, each byte telling its iovec."""
    return [bytes([65 + i % 26]) * size_of(i) for i in range(count)]


def receive(sock: socket.socket, size: int) -> bytes:
    got = b""
    while len(got) < size:
        got += sock.recv(size - len(got))
    return got


@pytest.mark.parametrize("count", [1, 2, 4, 5, 16, 17, 25, 40, MAX_IOV])  # 4: read before the loop; 16: the bound before
def test_sendmsg_iovecs_up_to_the_bound_are_captured_whole(source, connection, count):
    client, server = connection
    source.read()
    parts = pieces(count)
    payload = b"".join(parts)
    assert client.sendmsg(parts) == len(payload) <= CAPTURE
    receive(server, len(payload))
    (event,) = sends_on(source, client.fileno(), 1)
    assert event.data == payload and event.total_len == len(payload)
    assert not event.flags & DataFlags.IOV_TRUNCATED


def test_writev_of_25_iovecs_like_grpcio(source, connection):
    client, server = connection
    source.read()
    parts = pieces(25, size_of=lambda i: 9 if i % 2 == 0 else 1 + i)  # frame headers and bodies
    payload = b"".join(parts)
    assert os.writev(client.fileno(), parts) == len(payload)
    receive(server, len(payload))
    (event,) = sends_on(source, client.fileno(), 1)
    assert event.data == payload and not event.flags


def test_the_capture_size_cuts_inside_the_iovecs(source, connection):
    client, server = connection
    source.read()
    parts = pieces(50, size_of=lambda i: 20)  # 1000 bytes, the cut falls in the 26th iovec
    payload = b"".join(parts)
    client.sendmsg(parts)
    receive(server, len(payload))
    (event,) = sends_on(source, client.fileno(), 1)
    assert event.data == payload[:CAPTURE] and event.total_len == 1000 and event.missing == 1000 - CAPTURE
    assert not event.flags & DataFlags.IOV_TRUNCATED  # cut by the capture size, not the iovec bound


def test_past_the_iovec_bound_the_loss_is_flagged_and_counted(source, connection):
    client, server = connection
    source.read()
    parts = pieces(MAX_IOV + 6)
    payload = b"".join(parts)
    assert len(payload) <= CAPTURE
    client.sendmsg(parts)
    receive(server, len(payload))
    (event,) = sends_on(source, client.fileno(), 1)
    kept = len(b"".join(parts[:MAX_IOV]))
    assert event.data == payload[:kept] and event.total_len == len(payload)
    assert event.flags & DataFlags.IOV_TRUNCATED


def test_recvmsg_into_many_buffers(source, connection):
    client, server = connection
    source.read()
    payload = b"".join(pieces(30))
    client.sendall(payload)
    buffers = [bytearray(3) for _ in range(40)]
    got = 0
    while got < len(payload):
        got += server.recvmsg_into(buffers)[0] if got == 0 else len(server.recv(len(payload) - got))
    deadline = time.monotonic() + 5
    reads: list[DataEvent] = []
    while time.monotonic() < deadline and sum(e.total_len for e in reads) < len(payload):
        reads += [e for e in source.read() if type(e) is DataEvent and e.fd == server.fileno() and e.direction == Direction.INGRESS]
        time.sleep(0.02)
    assert b"".join(e.data for e in reads) == payload
