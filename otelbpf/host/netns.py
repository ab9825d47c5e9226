"""Network namespaces of traced processes: which one a process is in, and a socket
connected from inside it.

A service in a pod (or a job in its own network namespace) listens on *its* loopback:
NCCL's RAS port, ``localhost:28028``, is reachable only from inside the namespace. The
agent runs in the host's namespace (hostNetwork). :func:`connect_in` switches the
calling thread into the process's namespace (``setns(2)`` on ``/proc/PID/ns/net``, per
thread: the agent's other threads stay where they are), makes and connects the socket
there, and switches back: a socket keeps the namespace it was made in. Needs
CAP_SYS_ADMIN (the agent has it, docs/kubernetes.md).
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_lock = threading.Lock()


def netns_of(pid: int) -> int | None:
    """The inode that names ``pid``'s network namespace (None: the process is gone)."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def own_netns() -> int:
    return os.stat(f"/proc/self/task/{threading.get_native_id()}/ns/net").st_ino


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


def connect_in(pid: int, host: str, port: int, timeout_s: float) -> socket.socket:
    """A TCP socket connected to ``host:port`` as seen from ``pid``'s network namespace, trying
    every address ``host`` resolves to, as NCCL's own client does (``localhost``: ::1 and
    127.0.0.1 both). Raises OSError (the last attempt's) when none connects."""
    target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        here = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            same = os.fstat(target).st_ino == os.fstat(here).st_ino
            if same:
                return _connect(host, port, timeout_s)
            with _lock:  # one thread switching at a time: a clear log if a switch back ever failed
                _setns(target)
                try:
                    return _connect(host, port, timeout_s)
                finally:
                    _setns(here)
        finally:
            os.close(here)
    finally:
        os.close(target)


def _addresses(host: str, port: int) -> list[tuple]:
    """Where to try ``host``: what it resolves to here; for ``localhost``, both loopbacks too,
    as the process may resolve it otherwise (its container's /etc/hosts: ::1 or 127.0.0.1)."""
    found = []
    if host == "localhost":
        found += [(socket.AF_INET6, socket.SOCK_STREAM, 0, "", ("::1", port, 0, 0)),
                  (socket.AF_INET, socket.SOCK_STREAM, 0, "", ("127.0.0.1", port))]  # fmt: skip
    try:
        found += socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    except OSError:
        pass
    unique = []
    for entry in found:
        if all(entry[4][:2] != seen[4][:2] for seen in unique):
            unique.append(entry)
    return unique


def _connect(host: str, port: int, timeout_s: float) -> socket.socket:
    last: OSError = OSError(f"{host}: no address")
    for family, kind, proto, _name, address in _addresses(host, port):
        sock = socket.socket(family, kind, proto)
        sock.settimeout(timeout_s)
        try:
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    raise last
