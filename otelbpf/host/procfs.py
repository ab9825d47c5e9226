"""What /proc tells about processes, their mapped files and their sockets.

Used at start-up (which processes to trace), once per newly seen process
(its resource attributes), to find the libraries a process maps (the
uprobes, TLS and GPU probes, the Python profiler) and for connections that
predate the agent (their tuple was never seen by the kernel probe). Every
function tolerates the process vanishing underneath it.
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass
from typing import Iterable

from otelbpf.core.events import ConnOpen

PROC = "/proc"
IPPROTO_TCP = 6
IPPROTO_UDP = 17


def process_exists(pid: int) -> bool:
    return os.path.exists(f"{PROC}/{pid}")


def _read(path: str, mode: str = "rb") -> bytes | str | None:
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return None


def parent_of(pid: int) -> int | None:
    stat = _read(f"{PROC}/{pid}/stat")
    if not stat:
        return None
    # the comm field may contain spaces and parentheses: split after the last ')'
    rest = stat.rsplit(b")", 1)[-1].split()
    return int(rest[1]) if len(rest) > 1 else None


def all_pids() -> list[int]:
    return [int(name) for name in os.listdir(PROC) if name.isdigit()]


def descendants(root: int) -> list[int]:
    """``root`` and every process below it in the process tree."""
    children: dict[int, list[int]] = {}
    for pid in all_pids():
        ppid = parent_of(pid)
        if ppid is not None:
            children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def comm_of(pid: int) -> str | None:
    comm = _read(f"{PROC}/{pid}/comm")
    return comm.decode("utf-8", "replace").rstrip("\n") if comm else None


def pids_with_comm(names: Iterable[str]) -> list[int]:
    wanted = set(names)
    return [pid for pid in all_pids() if comm_of(pid) in wanted]


def cmdline_of(pid: int) -> list[str]:
    raw = _read(f"{PROC}/{pid}/cmdline")
    if not raw:
        return []
    return [part.decode("utf-8", "replace") for part in raw.rstrip(b"\0").split(b"\0")]


def environ_of(pid: int) -> dict[str, str]:
    raw = _read(f"{PROC}/{pid}/environ")
    env: dict[str, str] = {}
    if not raw:
        return env
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def exe_of(pid: int) -> str | None:
    try:
        return os.readlink(f"{PROC}/{pid}/exe")
    except OSError:
        return None


def cgroup_of(pid: int) -> str:
    raw = _read(f"{PROC}/{pid}/cgroup", "r")
    return raw or ""


# -- mapped files ------------------------------------------------------------


@dataclass(frozen=True)
class Mapping:
    """One executable file mapping of a process: its address range, the file
    offset it starts at, and the file's path as the process sees it."""

    start: int
    end: int
    offset: int
    path: str


def executable_mappings(pid: int) -> list[Mapping]:
    """The process's executable file mappings, in maps order ([] if it is gone)."""
    try:
        with open(f"{PROC}/{pid}/maps") as maps:
            text = maps.read()
    except OSError:
        return []
    return parse_maps(text)


def parse_maps(text: str) -> list[Mapping]:
    """The executable file mappings in the text of a /proc/PID/maps file
    (anonymous and deleted files left out)."""
    out = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or "x" not in parts[1] or not parts[5].startswith("/"):
            continue
        path = parts[5]
        if path.endswith(" (deleted)"):
            continue
        start, _, end = parts[0].partition("-")
        out.append(Mapping(int(start, 16), int(end, 16), int(parts[2], 16), path))
    return out


# -- sockets -----------------------------------------------------------------


def socket_inode(pid: int, fd: int) -> int | None:
    try:
        target = os.readlink(f"{PROC}/{pid}/fd/{fd}")
    except OSError:
        return None
    if target.startswith("socket:[") and target.endswith("]"):
        return int(target[8:-1])
    return None


def _parse_hex_address(text: str, family: int) -> tuple[str, int]:
    addr_hex, port_hex = text.split(":")
    raw = bytes.fromhex(addr_hex)
    if family == socket.AF_INET:
        packed = struct.pack("<I", struct.unpack(">I", raw)[0])
        return socket.inet_ntop(socket.AF_INET, packed), int(port_hex, 16)
    # /proc prints IPv6 as four host-order 32-bit words
    words = struct.unpack(">4I", raw)
    packed = struct.pack("<4I", *words)
    addr = socket.inet_ntop(socket.AF_INET6, packed)
    if addr.startswith("::ffff:") and "." in addr:
        addr = addr[7:]
    return addr, int(port_hex, 16)


_TABLES = {
    IPPROTO_TCP: (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)),
    IPPROTO_UDP: (("udp", socket.AF_INET), ("udp6", socket.AF_INET6)),
}


def socket_tuple_by_inode(pid: int, inode: int, protocol: int) -> tuple[int, str, int, str, int] | None:
    """(family, local addr, local port, peer addr, peer port) of a TCP or UDP
    socket, from the process's own network namespace. For an unconnected UDP
    socket the peer is ("", 0)."""
    for name, family in _TABLES[protocol]:
        table = _read(f"{PROC}/{pid}/net/{name}", "r")
        if not table:
            continue
        wanted = str(inode)
        for line in table.splitlines()[1:]:
            cols = line.split()
            if len(cols) > 9 and cols[9] == wanted:
                local = _parse_hex_address(cols[1], family)
                peer = _parse_hex_address(cols[2], family)
                if protocol == IPPROTO_UDP and peer[1] == 0:
                    peer = ("", 0)
                return family, local[0], local[1], peer[0], peer[1]
    return None


def tcp_sockets(pid: int) -> Iterable[tuple[int, tuple[int, str, int, str, int]]]:
    """(inode, (family, local addr, local port, peer addr, peer port)) of every
    TCP socket in the process's network namespace."""
    for name, family in _TABLES[IPPROTO_TCP]:
        table = _read(f"{PROC}/{pid}/net/{name}", "r")
        for line in (table or "").splitlines()[1:]:
            cols = line.split()
            if len(cols) > 9 and cols[9] != "0":
                local = _parse_hex_address(cols[1], family)
                peer = _parse_hex_address(cols[2], family)
                yield int(cols[9]), (family, local[0], local[1], peer[0], peer[1])


#: /proc/net/tcp's state column for a listening socket (TCP_LISTEN).
_TCP_LISTEN = "0A"


def _raw_address(text: str) -> bytes:
    """/proc's hex address as the kernel holds it (network order), IPv4 in 4 bytes, IPv6 in 16."""
    raw = bytes.fromhex(text)
    return b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))


_TCP_ESTABLISHED = "01"


@dataclass(frozen=True)
class TcpEnds:
    """A process's TCP sockets, as the propagation needs them (crossnode.py)."""

    #: (family, address in network order, port) of each listening socket; an
    #: unspecified address (a wildcard listener) is all zero bytes
    listening: list[tuple[int, bytes, int]]
    #: established sockets whose local port it does not listen on: connections it made
    outgoing: int


def tcp_ends(pid: int) -> TcpEnds:
    """The TCP sockets ``pid`` holds (its own fds, read in its own network namespace)."""
    try:
        fds = os.listdir(f"{PROC}/{pid}/fd")
    except OSError:
        return TcpEnds([], 0)
    inodes = set()
    for fd in fds:
        try:
            target = os.readlink(f"{PROC}/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    listening, established = [], []
    for name, family in _TABLES[IPPROTO_TCP]:
        table = _read(f"{PROC}/{pid}/net/{name}", "r")
        for line in (table or "").splitlines()[1:]:
            cols = line.split()
            if len(cols) <= 9 or cols[9] not in inodes:
                continue
            addr, port = cols[1].split(":")
            if cols[3] == _TCP_LISTEN:
                listening.append((family, _raw_address(addr), int(port, 16)))
            elif cols[3] == _TCP_ESTABLISHED:
                established.append(int(port, 16))
    ports = {port for _, _, port in listening}
    return TcpEnds(listening, sum(1 for port in established if port not in ports))


def fill_tuple_from_proc(event: ConnOpen) -> bool:
    """Complete a ConnOpen whose tuple the kernel did not see (a TCP socket
    older than the agent; any UDP socket, whose local port and, when
    connected, peer only /proc knows). Returns False if the socket is gone."""
    inode = socket_inode(event.pid, event.fd)
    if inode is None:
        return False
    protocols = (IPPROTO_UDP,) if event.protocol == IPPROTO_UDP else (IPPROTO_TCP, IPPROTO_UDP)
    for protocol in protocols:
        found = socket_tuple_by_inode(event.pid, inode, protocol)
        if found is not None:
            event.family, event.local_addr, event.local_port, event.peer_addr, event.peer_port = found
            event.protocol = protocol
            return True
    return False
