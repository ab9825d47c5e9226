"""UDP datagrams through the real probes: EbpfSource driven in-process.

The test process traces itself (--pid of its own pid; the agent filter only
excludes itself under --all): a UDP echo server thread and a client in this
process exchange datagrams with sendto/recvfrom, sendmsg/recvmsg, a connected
socket (send/recv, no address in the syscall), and libc's sendmmsg/recvmmsg
through ctypes. The source must yield DatagramEvents with each datagram's
payload and peer address and port.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import socket
import time

import pytest

from otelbpf.core.events import ConnOpen, DataEvent, DatagramEvent
from protocols.base import Direction

pytestmark = pytest.mark.ebpf


@pytest.fixture(scope="module")
def source():
    from otelbpf.sources.ebpf import CaptureConfig, EbpfSource

    src = EbpfSource(CaptureConfig(pids=[os.getpid()], capture_bytes=256, python_tasks=False, capture_udp=True))
    src.start()
    yield src
    src.close()


def drain(src, want, timeout=5.0):
    """Events until ``want(events)`` holds or the timeout passes."""
    events = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events += src.read()
        if want(events):
            break
        time.sleep(0.02)
    return events


def datagrams(events, fd=None):
    return [e for e in events if type(e) is DatagramEvent and (fd is None or e.fd == fd)]


def test_sendto_recvfrom_carry_payload_and_peer(source):
    source.read()
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.bind(("127.0.0.1", 0))
    sport, cport = server.getsockname()[1], client.getsockname()[1]
    sfd, cfd = server.fileno(), client.fileno()
    try:
        for i in range(3):
            client.sendto(b"ping %d" % i, ("127.0.0.1", sport))
            data, addr = server.recvfrom(2048)
            server.sendto(data.upper(), addr)
            assert client.recvfrom(2048)[0] == data.upper()
        big = b"x" * 1000
        client.sendto(big, ("127.0.0.1", sport))
        server.recvfrom(2048)
        events = drain(source, lambda ev: len(datagrams(ev)) >= 14)
    finally:
        server.close()
        client.close()
    client_out = [e for e in datagrams(events, cfd) if e.direction == Direction.EGRESS]
    server_in = [e for e in datagrams(events, sfd) if e.direction == Direction.INGRESS]
    server_out = [e for e in datagrams(events, sfd) if e.direction == Direction.EGRESS]
    client_in = [e for e in datagrams(events, cfd) if e.direction == Direction.INGRESS]
    assert [e.data for e in client_out[:3]] == [b"ping 0", b"ping 1", b"ping 2"]
    assert all((e.peer_addr, e.peer_port, e.family) == ("127.0.0.1", sport, socket.AF_INET) for e in client_out)
    assert [e.data for e in server_in[:3]] == [b"ping 0", b"ping 1", b"ping 2"]
    assert all((e.peer_addr, e.peer_port) == ("127.0.0.1", cport) for e in server_in)
    assert [e.data for e in server_out] == [b"PING 0", b"PING 1", b"PING 2"]
    assert all((e.peer_addr, e.peer_port) == ("127.0.0.1", cport) for e in server_out)
    assert [e.data for e in client_in] == [b"PING 0", b"PING 1", b"PING 2"]
    assert all((e.peer_addr, e.peer_port) == ("127.0.0.1", sport) for e in client_in)
    # larger than the capture size: counted, truncated
    assert client_out[3].total_len == 1000 and client_out[3].data == b"x" * 256 and client_out[3].missing == 744
    assert server_in[3].total_len == 1000 and len(server_in[3].data) == 256
    # one ConnOpen per socket, local port from /proc, protocol UDP
    opens = {e.fd: e for e in events if type(e) is ConnOpen}
    assert opens[sfd].local_port == sport and opens[sfd].protocol == socket.IPPROTO_UDP
    assert opens[cfd].local_port == cport
    assert not [e for e in events if type(e) is DataEvent and e.fd in (sfd, cfd)]


def test_sendmsg_recvmsg_ipv6_and_connected_socket(source):
    source.read()
    server = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    server.bind(("::1", 0))
    sport = server.getsockname()[1]
    client = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    client.connect(("::1", sport))  # connected: send()/recv() name no address
    cport = client.getsockname()[1]
    sfd, cfd = server.fileno(), client.fileno()
    try:
        client.send(b"hello over v6")
        data, _anc, _flags, addr = server.recvmsg(2048)
        server.sendmsg([b"re: ", data], [], 0, addr)
        assert client.recv(2048) == b"re: hello over v6"
        events = drain(source, lambda ev: len(datagrams(ev)) >= 4)
    finally:
        server.close()
        client.close()
    by = {(e.fd, e.direction): e for e in datagrams(events)}
    sent = by[(cfd, Direction.EGRESS)]
    assert sent.data == b"hello over v6"
    assert (sent.peer_addr, sent.peer_port, sent.family) == ("::1", sport, socket.AF_INET6)  # from /proc
    got = by[(sfd, Direction.INGRESS)]
    assert (got.data, got.peer_addr, got.peer_port) == (b"hello over v6", "::1", cport)
    reply = by[(sfd, Direction.EGRESS)]
    assert (reply.data, reply.peer_addr, reply.peer_port) == (b"re: hello over v6", "::1", cport)
    back = by[(cfd, Direction.INGRESS)]
    assert (back.data, back.peer_addr, back.peer_port) == (b"re: hello over v6", "::1", sport)


def test_multicast_send_names_the_group(source):
    source.read()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    fd = sock.fileno()
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 0)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 0)
    try:
        try:
            sock.sendto(b"to the group", ("239.1.2.3", 5353))
        except OSError as exc:  # no route for multicast in this namespace
            pytest.skip(f"cannot send multicast here: {exc}")
        events = drain(source, lambda ev: len(datagrams(ev, fd)) >= 1)
    finally:
        sock.close()
    [sent] = datagrams(events, fd)
    assert (sent.data, sent.peer_addr, sent.peer_port, sent.direction) == (b"to the group", "239.1.2.3", 5353, Direction.EGRESS)


# -- sendmmsg / recvmmsg through libc ------------------------------------------


class IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class MsgHdr(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_void_p),
        ("namelen", ctypes.c_uint32),
        ("iov", ctypes.POINTER(IOVec)),
        ("iovlen", ctypes.c_size_t),
        ("control", ctypes.c_void_p),
        ("controllen", ctypes.c_size_t),
        ("flags", ctypes.c_int),
    ]


class MMsgHdr(ctypes.Structure):
    _fields_ = [("hdr", MsgHdr), ("len", ctypes.c_uint)]


class SockaddrIn(ctypes.Structure):
    _fields_ = [("family", ctypes.c_uint16), ("port", ctypes.c_uint16), ("addr", ctypes.c_uint8 * 4), ("zero", ctypes.c_uint8 * 8)]


def test_sendmmsg_and_recvmmsg_place_each_datagram(source):
    assert ctypes.sizeof(MMsgHdr) == 64
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    source.read()
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    sport = server.getsockname()[1]
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.bind(("127.0.0.1", 0))
    cport = client.getsockname()[1]
    sfd, cfd = server.fileno(), client.fileno()
    payloads = [b"first", b"second datagram", b"3"]
    keep = []
    try:
        dest = SockaddrIn(socket.AF_INET, socket.htons(sport), (ctypes.c_uint8 * 4)(127, 0, 0, 1))
        vec = (MMsgHdr * len(payloads))()
        for i, payload in enumerate(payloads):
            buf = ctypes.create_string_buffer(payload, len(payload))
            iov = IOVec(ctypes.cast(buf, ctypes.c_void_p), len(payload))
            keep += [buf, iov]
            vec[i].hdr.name = ctypes.cast(ctypes.pointer(dest), ctypes.c_void_p)
            vec[i].hdr.namelen = ctypes.sizeof(dest)
            vec[i].hdr.iov = ctypes.pointer(iov)
            vec[i].hdr.iovlen = 1
        assert libc.sendmmsg(client.fileno(), vec, len(payloads), 0) == len(payloads), os.strerror(ctypes.get_errno())
        time.sleep(0.05)
        rvec = (MMsgHdr * 4)()
        names = (SockaddrIn * 4)()
        for i in range(4):
            buf = ctypes.create_string_buffer(64)
            iov = IOVec(ctypes.cast(buf, ctypes.c_void_p), 64)
            keep += [buf, iov]
            rvec[i].hdr.name = ctypes.cast(ctypes.pointer(names[i]), ctypes.c_void_p)
            rvec[i].hdr.namelen = ctypes.sizeof(SockaddrIn)
            rvec[i].hdr.iov = ctypes.pointer(iov)
            rvec[i].hdr.iovlen = 1
        got = libc.recvmmsg(server.fileno(), rvec, 4, socket.MSG_DONTWAIT, None)
        assert got == len(payloads), os.strerror(ctypes.get_errno())
        events = drain(source, lambda ev: len(datagrams(ev)) >= 6)
    finally:
        server.close()
        client.close()
    sent = [e for e in datagrams(events, cfd) if e.direction == Direction.EGRESS]
    assert [e.data for e in sent] == payloads
    assert all((e.peer_addr, e.peer_port) == ("127.0.0.1", sport) for e in sent)
    received = [e for e in datagrams(events, sfd) if e.direction == Direction.INGRESS]
    assert [e.data for e in received] == payloads
    assert all((e.peer_addr, e.peer_port) == ("127.0.0.1", cport) for e in received)
    assert source.kernel_stats()["mmsg_unknown"] == 0


def test_peek_is_not_captured(source):
    source.read()
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sfd = server.fileno()
    try:
        client.sendto(b"once", server.getsockname())
        assert server.recv(64, socket.MSG_PEEK) == b"once"
        assert server.recvfrom(64)[0] == b"once"
        events = drain(source, lambda ev: len(datagrams(ev)) >= 2)
        time.sleep(0.1)
        events += source.read()
    finally:
        server.close()
        client.close()
    received = [e for e in datagrams(events, sfd) if e.direction == Direction.INGRESS]
    assert [e.data for e in received] == [b"once"]
