"""EarlyTuples: the tuple of a TCP socket noted at start outlives the socket.

Real sockets and the real /proc: a connection made in this process is noted,
closed, and its ConnOpen (as the kernel would send it, tuple unknown) is then
completed from the note, which /proc can no longer do.
"""

from __future__ import annotations

import os
import socket

from otelbpf.core.events import ConnOpen
from otelbpf.host import procfs
from otelbpf.sources.early_tuples import EarlyTuples


def connected_pair(family=socket.AF_INET, host="127.0.0.1"):
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.bind((host, 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname()[:2])
    server, _ = listener.accept()
    listener.close()
    return client, server


def conn_open(fd: int, protocol: int = procfs.IPPROTO_TCP) -> ConnOpen:
    return ConnOpen(ts_ns=1, pid=os.getpid(), tid=os.getpid(), fd=fd, conn_id=1, protocol=protocol)


def test_a_closed_socket_gets_the_tuple_it_had_at_start():
    client, server = connected_pair()
    early = EarlyTuples()
    early.snapshot([os.getpid()])
    client_fd, port = client.fileno(), client.getsockname()[1]
    server_port = server.getsockname()[1]
    client.close()
    server.close()
    event = conn_open(client_fd)
    assert not procfs.fill_tuple_from_proc(event)  # what the agent had before: gone
    assert early.fill(event)
    assert (event.family, event.local_addr, event.local_port) == (socket.AF_INET, "127.0.0.1", port)
    assert (event.peer_addr, event.peer_port) == ("127.0.0.1", server_port)


def test_ipv6_dual_stack_socket_reads_as_the_ipv4_address():
    """grpcio's server listens on [::]: its accepted sockets are AF_INET6, v4-mapped."""
    client, server = connected_pair(socket.AF_INET6, "::")
    early = EarlyTuples()
    early.snapshot([os.getpid()])
    event = conn_open(server.fileno())
    assert early.fill(event)
    assert event.family == socket.AF_INET6 and event.local_addr in ("::1", "127.0.0.1")
    assert event.peer_port == client.getsockname()[1]
    client.close()
    server.close()


def test_only_tcp_connections_without_a_tuple_and_listeners_left_out():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client, server = connected_pair()
    early = EarlyTuples()
    early.snapshot([os.getpid()])
    try:
        assert not early.fill(conn_open(listener.fileno()))  # not connected
        assert not early.fill(conn_open(client.fileno(), protocol=procfs.IPPROTO_UDP))
        known = conn_open(client.fileno())
        known.family, known.peer_port = socket.AF_INET, 1
        assert not early.fill(known) and known.peer_port == 1  # the kernel's tuple stands
        early.forget(os.getpid())
        assert len(early) == 0 and not early.fill(conn_open(client.fileno()))
    finally:
        for sock in (listener, client, server):
            sock.close()
