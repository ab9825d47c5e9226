"""What the agent never traces: itself, OpenTelemetry Collectors, and the
traffic it exports (no feedback loop of spans about spans).

Processes (``--exclude-pid``, ``--exclude-comm``) are dropped **in the
kernel** by the same filter that picks traced processes (bpf/common.h,
``is_traced``): an excluded process's I/O is never copied, so excluding costs
nothing per byte. Its entry in the traced-process array is inherited by
children at fork; comm patterns are re-checked at exec (bpf/proc.c).

Connections (``--exclude-port``, the OTLP endpoint's address) are dropped in
user space **at connection start**: the kernel learns the tuple only when the
connection is established, the filter that runs first in every probe cannot
afford a tuple lookup for every process, and a muted connection (the
``conns`` map) costs the kernel one lookup per syscall and no copy. The few
payload records already in flight are discarded here.

The default list (``--no-default-excludes`` turns it off): the agent itself
(always, AGENT_TGID), Collector binaries ``otelcol*`` (otelcol,
otelcol-contrib, otelcol-k8s, ...), and the configured OTLP endpoint's
address and port.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from otelbpf.core.events import ConnClose, ConnOpen, ConnPeer, DataEvent, Event, Source

log = logging.getLogger("otelbpf")

#: Process names never traced unless --no-default-excludes.
DEFAULT_EXCLUDED_COMMS = ("otelcol*",)
#: The kernel's comm is 15 bytes; the BPF table holds this many patterns.
MAX_COMM_BYTES = 15
MAX_EXCLUDED_COMMS = 8


def comm_prefix(pattern: str) -> tuple[bytes, int]:
    """The BPF table entry for a comm pattern: (bytes, how many must match).
    ``NAME*`` matches names starting with NAME; ``NAME`` matches exactly
    (its NUL terminator is compared too)."""
    prefix = pattern.endswith("*")
    name = pattern[:-1] if prefix else pattern
    raw = name.encode()
    if not raw or len(raw) > MAX_COMM_BYTES or "*" in name:
        raise ValueError(f"--exclude-comm {pattern!r}: a process name of 1 to 15 bytes, optionally ending in *")
    return raw, len(raw) if prefix else len(raw) + 1


def comm_matches(pattern: str, comm: str) -> bool:
    """The kernel's rule (bpf/common.h comm_excluded), for processes already running."""
    raw, length = comm_prefix(pattern)
    name = comm.encode()[:MAX_COMM_BYTES] + b"\0"
    return (raw + b"\0")[:length] == name[:length]


def normalize_addr(addr: str) -> str:
    """One spelling per address: IPv4-mapped IPv6 becomes IPv4."""
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return addr
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def endpoint_addresses(url: str, default_port: int) -> set[tuple[str, int]]:
    """(address, port) pairs an OTLP endpoint URL resolves to now. A name that
    does not resolve gives nothing (logged): the exporter will say why."""
    parts = urlsplit(url)
    host = parts.hostname
    if not host:
        return set()
    try:
        port = parts.port or default_port
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (OSError, ValueError) as exc:
        log.debug("exclusions: cannot resolve the OTLP endpoint %s: %s", url, exc)
        return set()
    return {(normalize_addr(info[4][0]), port) for info in infos}


@dataclass
class Exclusions:
    comms: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    ports: set[int] = field(default_factory=set)
    #: (address, port) of the OTLP endpoint(s): either end of a connection matching one
    endpoints: set[tuple[str, int]] = field(default_factory=set)

    def validate(self) -> None:
        if len(self.comms) > MAX_EXCLUDED_COMMS:
            raise ValueError(f"at most {MAX_EXCLUDED_COMMS} --exclude-comm patterns (defaults included)")
        for pattern in self.comms:
            comm_prefix(pattern)
        for port in self.ports:
            if not 0 < port < 65536:
                raise ValueError(f"--exclude-port {port}: not a port")

    def connection_excluded(self, event: ConnOpen) -> bool:
        if not (self.ports or self.endpoints) or not (event.local_port or event.peer_port):
            return False
        if event.local_port in self.ports or event.peer_port in self.ports:
            return True
        return (normalize_addr(event.local_addr), event.local_port) in self.endpoints or (
            normalize_addr(event.peer_addr),
            event.peer_port,
        ) in self.endpoints

    def describe(self) -> str:
        parts = []
        if self.comms:
            parts.append("comm " + ",".join(self.comms))
        if self.pids:
            parts.append("pid " + ",".join(map(str, self.pids)))
        if self.ports:
            parts.append("port " + ",".join(map(str, sorted(self.ports))))
        if self.endpoints:
            parts.append("endpoint " + ",".join(f"{a}:{p}" for a, p in sorted(self.endpoints)))
        return "; ".join(parts) or "none"


class ExcludingSource:
    """Wraps a live source: connections that match the exclusions are muted
    in the kernel at their first sight and their events dropped here. Every
    other attribute is the wrapped source's."""

    def __init__(self, source, exclusions: Exclusions, counters=None) -> None:
        self._source = source
        self.exclusions = exclusions
        self.counters = counters
        self._dropped: set[int] = set()

    def __getattr__(self, name):
        return getattr(self._source, name)

    def read(self) -> list[Event]:
        events = self._source.read()
        if not (self.exclusions.ports or self.exclusions.endpoints):
            return events
        dropped = self._dropped
        kept = []
        for event in events:
            kind = type(event)
            if kind is ConnOpen and self.exclusions.connection_excluded(event):
                dropped.add(event.conn_id)
                self._source.mute(event.pid, event.fd, event.conn_id, Source.SOCKET)
                if self.counters is not None:
                    self.counters.add("otelbpf.connections.excluded")
                continue
            if dropped and kind in (DataEvent, ConnPeer, ConnClose) and event.conn_id in dropped:
                if kind is ConnClose:
                    dropped.discard(event.conn_id)
                continue
            kept.append(event)
        if len(dropped) > 65536:  # closes lost with a ring-buffer overflow: bound the set
            dropped.clear()
        return kept
