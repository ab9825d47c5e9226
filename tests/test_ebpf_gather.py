"""Gathered writes through the real probes: sendmsg/writev with many iovecs.

The test process traces itself (EbpfSource in-process, --pid of its own pid)
and writes on a loopback TCP connection with sendmsg and writev of up to 64
iovecs (MAX_IOV; grpcio's first write on a channel has 25), of varied sizes.
The events must carry the bytes in order, whole when they fit the capture
size, cut at the capture size otherwise, and flagged IOV_TRUNCATED (with the
lost bytes counted) past the iovec bound. A readv/recvmsg into many buffers
takes the same loop.

On a connection marked for whole capture (EbpfSource.capture_whole: its bodies
are read) a gathered call larger than the capture size is captured whole, up to
the 256 KiB bound, as pieces that span iovecs (bpf/socket.c, emit_whole_gathered);
so is a flat one, and a new connection to a marked server endpoint from its
first byte.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time

import pytest

from conftest import ROOT
from otelbpf.core.events import DataEvent, DataFlags
from protocols.base import Direction

pytestmark = pytest.mark.ebpf

CAPTURE = 512
MAX_IOV = int(re.search(r"#define MAX_IOV (\d+)", (ROOT / "bpf" / "common.h").read_text()).group(1))
WHOLE = 256 * 1024  # bpf/capture.h WHOLE_CAPTURE_BYTES


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


# -- whole capture of marked connections ----------------------------------------------


def events_on(source, fd: int, direction: Direction, total: int, timeout: float = 5.0) -> list[DataEvent]:
    """The data events of ``fd`` in ``direction`` until they stand for ``total`` bytes."""
    events: list[DataEvent] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and sum(e.total_len for e in events) < total:
        events += [e for e in source.read() if type(e) is DataEvent and e.fd == fd and e.direction == direction]
        time.sleep(0.02)
    return events


def mark_whole(source, sock: socket.socket) -> None:
    """Mark ``sock``'s connection for whole capture, as the agent does on an LLM call:
    its conn_id from a first small send."""
    sock.send(b"x")
    (event,) = sends_on(source, sock.fileno(), 1)
    source.capture_whole(os.getpid(), sock.fileno(), event.conn_id)


def receiving(sock: socket.socket, size: int) -> threading.Thread:
    """Read ``size`` bytes from ``sock`` in a thread (a big send blocks until they are read)."""
    thread = threading.Thread(target=receive, args=(sock, size), daemon=True)
    thread.start()
    return thread


def assert_whole(events: list[DataEvent], payload: bytes, kept: int | None = None) -> None:
    """One call's records: flagged pieces whose bytes are ``payload``'s first ``kept``
    (all of it by default) and whose total_len add up to the call's."""
    kept = len(payload) if kept is None else kept
    assert len(events) > 1 and all(e.flags & DataFlags.PIECE for e in events), [(e.total_len, e.flags) for e in events]
    assert len({e.ts_ns for e in events}) == 1  # one call
    assert b"".join(e.data for e in events) == payload[:kept]
    assert sum(e.total_len for e in events) == len(payload)
    assert sum(e.missing for e in events) == events[-1].missing == len(payload) - kept


def test_a_marked_connections_gathered_send_is_captured_whole_across_iovecs(source, connection):
    client, server = connection
    mark_whole(source, client)
    receive(server, 1)
    parts = pieces(40, size_of=lambda i: 97 + 1013 * (i % 5))  # ~80 KB in iovecs of 97 B .. 4 KB
    payload = b"".join(parts)
    reader = receiving(server, len(payload))
    assert client.sendmsg(parts) == len(payload)
    reader.join(10)
    assert_whole(events_on(source, client.fileno(), Direction.EGRESS, len(payload)), payload)


def test_a_marked_writev_past_the_bound_is_cut_there_and_the_rest_counted(source, connection):
    client, server = connection
    mark_whole(source, client)
    receive(server, 1)
    parts = [bytes([65 + i]) * 30000 for i in range(10)]  # 300 KB: past the 256 KiB bound
    payload = b"".join(parts)
    reader = receiving(server, len(payload))
    assert os.writev(client.fileno(), parts) == len(payload)
    reader.join(10)
    events = events_on(source, client.fileno(), Direction.EGRESS, len(payload))
    assert_whole(events, payload, kept=WHOLE)
    assert not events[-1].flags & DataFlags.IOV_TRUNCATED  # cut by the size bound, not the iovec bound


def test_a_marked_gather_past_the_iovec_bound_is_cut_there_flagged(source, connection):
    client, server = connection
    mark_whole(source, client)
    receive(server, 1)
    parts = pieces(MAX_IOV + 6, size_of=lambda i: 1000)
    payload = b"".join(parts)
    reader = receiving(server, len(payload))
    assert client.sendmsg(parts) == len(payload)
    reader.join(10)
    events = events_on(source, client.fileno(), Direction.EGRESS, len(payload))
    assert_whole(events, payload, kept=MAX_IOV * 1000)
    assert events[-1].flags & DataFlags.IOV_TRUNCATED


def test_a_marked_recvmsg_into_many_buffers_is_captured_whole(source, connection):
    client, server = connection
    mark_whole(source, server)
    receive(client, 1)
    payload = bytes(range(256)) * 200  # 51200 bytes
    client.sendall(payload)
    time.sleep(0.1)  # all of it waiting: one receive
    buffers = [bytearray(700) for _ in range(MAX_IOV)]  # 44800 bytes of room
    got = server.recvmsg_into(buffers)[0]
    assert got > CAPTURE
    receive(server, len(payload) - got)
    reads = events_on(source, server.fileno(), Direction.INGRESS, len(payload))
    read = b"".join(bytes(b) for b in buffers)[:got]
    assert_whole([e for e in reads if e.ts_ns == reads[0].ts_ns], read)  # the recvmsg's records: one call, one ts


def test_a_marked_flat_send_and_receive_are_captured_whole(source, connection):
    client, server = connection
    mark_whole(source, client)
    mark_whole(source, server)
    receive(client, 1)
    receive(server, 1)
    payload = os.urandom(70000)
    reader = receiving(server, len(payload))
    client.sendall(payload)
    reader.join(10)
    assert_whole(events_on(source, client.fileno(), Direction.EGRESS, len(payload)), payload)


def test_a_new_connection_to_a_marked_server_endpoint_is_whole_from_its_first_byte(source):
    """What the agent's delay cannot spoil: the endpoint of a marked connection is
    remembered in the kernel, and the next connections to it (both sides) are captured
    whole before user space has seen them."""
    listener = socket.create_server(("127.0.0.1", 0))
    first = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    mark_whole(source, first)
    receive(accepted, 1)
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    try:
        payload = os.urandom(40000)
        reader = receiving(server, len(payload))
        client.sendall(payload)  # the new connection's first call
        reader.join(10)
        assert_whole(events_on(source, client.fileno(), Direction.EGRESS, len(payload)), payload)
        server.sendall(payload)  # the server's side inherits it too
        receive(client, len(payload))
        assert_whole(events_on(source, server.fileno(), Direction.EGRESS, len(payload)), payload)
    finally:
        for sock in (first, accepted, client, server):
            sock.close()
