"""TCP tuples of the sockets traced processes held when the agent started.

The kernel probe learns a TCP connection's tuple when it reaches ESTABLISHED;
a connection older than the agent has none there, and user space reads it
from ``/proc/PID/net/tcp*`` when the connection's first event is decoded. That
read races the connection: a gRPC server whose client finished its calls and
closed the channel has closed the socket before a busy agent decodes the
events, and the tuple (with the client/server pairing it enables) was lost.

So, once the probes are attached, the agent notes the tuple of every TCP
socket its traced processes already hold, by (pid, fd). Any TCP connection
opened after that has its tuple from the kernel, so this snapshot is only
asked for a TCP connection the kernel did not see open and /proc no longer
knows: exactly the sockets it describes (an fd closed and reused for a new TCP
connection would have been seen by the kernel).
"""

from __future__ import annotations

import os
from typing import Iterable

from otelbpf.core.events import ConnOpen
from otelbpf.host import procfs

#: Bound on remembered sockets (a host traced with --all may hold many).
MAX_SOCKETS = 65536

Tuple = tuple[int, str, int, str, int]


class EarlyTuples:
    """pid -> fd -> (family, local addr, local port, peer addr, peer port)."""

    def __init__(self) -> None:
        self._by_pid: dict[int, dict[int, Tuple]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def snapshot(self, pids: Iterable[int]) -> None:
        """Note the connected TCP sockets of ``pids`` (once per network namespace
        for the tables: processes of one namespace share them)."""
        tables: dict[str, dict[int, Tuple]] = {}
        for pid in pids:
            namespace = _netns(pid)
            if namespace is None:
                continue
            if namespace not in tables:
                tables[namespace] = _tcp_table(pid)
            by_inode = tables[namespace]
            if not by_inode:
                continue
            for fd, inode in _socket_fds(pid):
                found = by_inode.get(inode)
                if found is not None:
                    if self._count >= MAX_SOCKETS:
                        return
                    self._by_pid.setdefault(pid, {})[fd] = found
                    self._count += 1

    def fill(self, event: ConnOpen) -> bool:
        """Give a TCP ConnOpen with no tuple the one its socket had at start."""
        if event.family or event.protocol != procfs.IPPROTO_TCP:
            return False
        found = self._by_pid.get(event.pid, {}).get(event.fd)
        if found is None:
            return False
        event.family, event.local_addr, event.local_port, event.peer_addr, event.peer_port = found
        return True

    def forget(self, pid: int) -> None:
        """The process exited: its fds mean nothing any more."""
        self._count -= len(self._by_pid.pop(pid, {}))


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"{procfs.PROC}/{pid}/ns/net")
    except OSError:
        return None


def _socket_fds(pid: int) -> list[tuple[int, int]]:
    try:
        names = os.listdir(f"{procfs.PROC}/{pid}/fd")
    except OSError:
        return []
    found = []
    for name in names:
        inode = procfs.socket_inode(pid, int(name))
        if inode is not None:
            found.append((int(name), inode))
    return found


def _tcp_table(pid: int) -> dict[int, Tuple]:
    """inode -> tuple of the connected TCP sockets in ``pid``'s namespace
    (listeners, peer port 0, are left out)."""
    table: dict[int, Tuple] = {}
    for inode, found in procfs.tcp_sockets(pid):
        if found[4]:
            table[inode] = found
    return table
