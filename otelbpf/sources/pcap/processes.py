"""The synthetic processes of a replay: who read and wrote the captured bytes.

A capture shows hosts and ports; the pipeline wants what processes did, with
pids, file descriptors and connection ids. Each server endpoint (ip, port)
becomes one process and each client ip another, whatever ephemeral ports it
used (:class:`Endpoint`), numbered from 1 in order of first appearance. The
TCP connections (``otelbpf.sources.pcap.replay``) and the UDP sockets
(``otelbpf.sources.pcap.datagrams``) of one replay share these processes,
their file descriptors and one sequence of connection ids
(:class:`SyntheticProcesses`).
"""

from __future__ import annotations

import heapq
import socket
from dataclasses import dataclass
from typing import Literal

Role = Literal["server", "client"]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """The synthetic process standing for one side of the captured traffic."""

    pid: int
    role: Role
    ip: str
    #: The listening port for a server; None for a client (one process per
    #: client ip, whatever ephemeral ports it used).
    port: int | None
    #: Readable name for the Resource, e.g. "10.0.0.2:8080", "client 10.0.0.1".
    service_name: str


def format_ip(raw: bytes) -> str:
    """A 4- or 16-byte address as text."""
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)


class FdTable:
    """File descriptors as a process gets them: the lowest free one, from 3."""

    def __init__(self) -> None:
        self._next = 3
        self._free: list[int] = []

    def allocate(self) -> int:
        if self._free:
            return heapq.heappop(self._free)
        self._next += 1
        return self._next - 1

    def release(self, fd: int) -> None:
        heapq.heappush(self._free, fd)


class SyntheticProcesses:
    """The processes of one replay, their file descriptor tables and the last
    connection id given out. ``endpoints`` (pid -> :class:`Endpoint`) gains an
    entry before the first event that carries its pid."""

    def __init__(self, endpoints: dict[int, Endpoint]) -> None:
        self.endpoints = endpoints
        self.pids: dict[tuple[bytes, int | None], int] = {}
        self.fds: dict[int, FdTable] = {}
        self.last_conn_id = 0

    def pid_for(self, role: Role, ip: bytes, port: int | None) -> int:
        """The server process at (``ip``, ``port``), or the client process of
        ``ip`` (``port`` None), made on first sight."""
        key = (ip, port)
        pid = self.pids.get(key)
        if pid is None:
            pid = self.pids[key] = len(self.pids) + 1
            text = format_ip(ip)
            if role == "server":
                name = f"[{text}]:{port}" if ":" in text else f"{text}:{port}"
            else:
                name = f"client {text}"
            self.endpoints[pid] = Endpoint(pid, role, text, port, name)
            self.fds[pid] = FdTable()
        return pid

    def next_conn_id(self) -> int:
        self.last_conn_id += 1
        return self.last_conn_id

    def open_socket(self, pid: int) -> tuple[int, int]:
        """A new socket of process ``pid``: its file descriptor (the lowest free) and a new connection id."""
        return self.fds[pid].allocate(), self.next_conn_id()

    def close_socket(self, pid: int, fd: int) -> None:
        self.fds[pid].release(fd)
