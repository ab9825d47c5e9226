"""The typed events every source yields (eBPF, pcap, recorded replay).

Sources decode their raw input into these and nothing else, so everything
downstream (connections, protocols, spans) is the same whatever the source.
Timestamps are CLOCK_REALTIME nanoseconds (sources convert from their clock).

Families (docs/architecture.md, "The journey of an event"):

* stream bytes: :class:`ConnOpen`, :class:`DataEvent`, :class:`ConnPeer`,
  :class:`ConnClose` (TCP and Unix stream sockets, TLS plaintext);
* datagrams: :class:`DatagramEvent` (UDP), one per datagram with its peer;
* processes: :class:`ProcessStart`, :class:`ProcessExit`;
* library calls seen by uprobes: :class:`CallEvent` (CUDA, NCCL, ...);
* loss: :class:`LostEvents`.

The pipeline dispatches on the event's type through one handler table
(``otelbpf.pipeline``), so a new family is a new class here and one entry
there.
"""

from __future__ import annotations

import enum
import socket
from dataclasses import dataclass

from protocols.base import Direction


class RoleHint(enum.IntEnum):
    """What the kernel saw of how a connection began, if anything."""

    UNKNOWN = 0
    ACCEPTED = 1  # the process accept()ed it: it is the server side
    CONNECTED = 2  # the process connect()ed it: it is the client side


class Source(enum.IntEnum):
    """Which probe family saw a payload.

    Detection and muting are per connection *and* source: the same socket
    carries TLS ciphertext (SOCKET) and, through the TLS library probes, its
    plaintext (TLS); giving up on the first must not silence the second.
    """

    SOCKET = 0  # socket syscalls: the bytes read()/write() moved
    TLS = 1  # TLS library uprobes (SSL_read/SSL_write): the plaintext


class DataFlags(enum.IntFlag):
    NONE = 0
    #: Bytes moved by sendfile(): counted, never captured.
    SENDFILE = 1
    #: The syscall's buffers held more iovecs than the probe walks.
    IOV_TRUNCATED = 2
    #: A sendmmsg/recvmmsg datagram the probe could not place in its array: counted, not captured.
    MMSG_UNKNOWN = 4
    #: One of several records of one call on a connection marked for whole capture
    #: (bpf/capture.h, DF_PIECE): its total_len is the bytes it stands for.
    PIECE = 8
    #: The record carried the ids the kernel fixed for a request (DataEvent.trace_ctx).
    TRACE_CTX = 16


class ContextOrigin(enum.IntEnum):
    """Where the kernel took a request's context from (bpf/capture.h, enum ctx_origin)."""

    FRESH = 1  # server: none came with the request, a new trace
    TCP_OPTION = 2  # server: the TCP option on the request's first segment
    HEADER = 3  # server: the request's traceparent header
    CLIENT = 4  # client: what the request carries on the wire


class WireContext:
    """The ids the kernel fixed for one request at the moment it was read or
    written (bpf/propagate.c), which the span of that request adopts: on a
    server's read, the trace it serves and the parent that came with it
    (``span_id``, empty for a fresh trace); on a client's write, the trace and
    the client span's own ``span_id``, which went on the wire."""

    __slots__ = ("trace_id", "span_id", "flags", "origin", "rule", "carriers")

    def __init__(self, trace_id: bytes, span_id: bytes, flags: int, origin: int, rule: int = 0, carriers: int = 0):
        self.trace_id = trace_id
        self.span_id = span_id
        self.flags = flags
        self.origin = origin
        #: client: which rule the kernel took the trace by (0 root, 1 thread, 2 process)
        self.rule = rule
        #: client: bits of where it went (1: the TCP option)
        self.carriers = carriers

    @property
    def parent_span_id(self) -> bytes:
        """A server's parent span (b"" for a fresh trace: all zero on the wire)."""
        return self.span_id if any(self.span_id) else b""

    def __repr__(self) -> str:
        return (f"WireContext({self.trace_id.hex()}, {self.span_id.hex()}, flags={self.flags}, "
                f"origin={ContextOrigin(self.origin).name if self.origin in (1, 2, 3, 4) else self.origin}, "
                f"rule={self.rule}, carriers={self.carriers})")


@dataclass(slots=True)
class ConnOpen:
    """First sight of a connection in a process (may predate the agent)."""

    ts_ns: int
    pid: int
    tid: int
    fd: int
    conn_id: int
    family: int = 0  # socket.AF_INET / AF_INET6 / AF_UNIX, 0 = unknown yet
    local_addr: str = ""
    local_port: int = 0
    peer_addr: str = ""
    peer_port: int = 0
    role_hint: RoleHint = RoleHint.UNKNOWN
    comm: str = ""
    #: Opaque identity of this end's socket, and (Unix sockets) of the other
    #: end's when known: a client's peer_sock_id is its server's sock_id.
    sock_id: int = 0
    peer_sock_id: int = 0
    #: IPPROTO_TCP / IPPROTO_UDP (0 for Unix sockets or when unknown).
    protocol: int = 0


@dataclass
class DataEvent:
    """Bytes one thread read or wrote on a connection, in one syscall.

    Built per syscall: a dataclass over an explicit ``__init__`` and ``__slots__``
    (a slotted dataclass as plain Python, an extension type with a C ``__init__``
    compiled; events.pxd declares its fields).
    """

    __slots__ = ("ts_ns", "pid", "tid", "fd", "conn_id", "direction", "total_len", "data", "flags", "task_id",
                 "source", "trace_ctx")
    ts_ns: int
    pid: int
    tid: int
    fd: int
    conn_id: int
    direction: Direction
    #: Bytes the syscall moved; ``len(data)`` of them were captured.
    total_len: int
    data: bytes
    #: DataFlags bits, kept as a plain int (enum arithmetic is slow per event).
    flags: int
    #: The asyncio task (its coroutine, opaque) whose step made the syscall; 0 if none.
    task_id: int
    #: Source (SOCKET, TLS) as a plain int.
    source: int
    #: The request's ids fixed by the kernel (a WireContext), when this read or write starts one
    #: and cross-node propagation is on; None otherwise.
    trace_ctx: "WireContext | None"

    def __init__(self, ts_ns, pid, tid, fd, conn_id, direction, total_len, data, flags=0, task_id=0,
                 source=0, trace_ctx=None) -> None:
        self.ts_ns = ts_ns
        self.pid = pid
        self.tid = tid
        self.fd = fd
        self.conn_id = conn_id
        self.direction = direction
        self.total_len = total_len
        self.data = data
        self.flags = flags
        self.task_id = task_id
        self.source = source
        self.trace_ctx = trace_ctx

    @property
    def missing(self) -> int:
        return self.total_len - len(self.data)


@dataclass(slots=True)
class DatagramEvent:
    """One datagram a thread sent or received on a socket (UDP), with its peer.

    ``conn_id`` names the socket (one per (pid, fd) sighting, as for streams);
    the peer is per datagram, since one unconnected socket talks to many.
    """

    ts_ns: int
    pid: int
    tid: int
    fd: int
    conn_id: int
    direction: Direction
    #: Bytes of the datagram; ``len(data)`` of them were captured.
    total_len: int
    data: bytes
    peer_addr: str = ""
    peer_port: int = 0
    family: int = 0
    flags: int = 0
    task_id: int = 0
    source: int = 0

    @property
    def missing(self) -> int:
        return self.total_len - len(self.data)


@dataclass(slots=True)
class ConnPeer:
    """The other end of a Unix-socket connection became known (first write)."""

    ts_ns: int
    pid: int
    tid: int
    fd: int
    conn_id: int
    peer_sock_id: int


@dataclass(slots=True)
class ConnClose:
    ts_ns: int
    pid: int
    tid: int
    fd: int
    conn_id: int


@dataclass(slots=True)
class ProcessStart:
    """A traced process exists: it was exec()ed while traced, or was found at start-up.

    Lets per-process probes (asyncio tasks, TLS, CUDA) attach before the
    process touches a traced socket, or when it never does.
    """

    ts_ns: int
    pid: int
    comm: str = ""
    #: The exec()ed file (from the kernel, for processes that exec()ed while traced).
    exe: str = ""


@dataclass(slots=True)
class ProcessExit:
    ts_ns: int
    pid: int


@dataclass(slots=True)
class LibraryLoad:
    """A traced process's dynamic loader changed its link map (a library was loaded or
    unloaded: bpf/loader.c): its maps are worth reading again. The eBPF source handles it
    itself (otelbpf/sources/loader.py); the pipeline never sees one."""

    ts_ns: int
    pid: int


@dataclass(slots=True)
class CallEvent:
    """A library function call seen by a uprobe (and its return, when probed).

    ``library`` and ``function`` are names resolved from the probe that fired
    (the kernel sends a probe id); ``args`` are the raw argument registers
    the probe read, ``ret`` the return value (0 when only the entry is probed).
    """

    ts_ns: int  # entry
    end_ns: int  # return; equal to ts_ns for entry-only probes
    pid: int
    tid: int
    library: str
    function: str
    args: tuple[int, ...] = ()
    ret: int = 0
    task_id: int = 0
    #: GPU kernel launches this thread made since its previous reported GPU
    #: call, and the time of the first of them (0: none); see bpf/gpu.c
    launches: int = 0
    first_launch_ns: int = 0
    #: the value args[0] pointed to at return (an out-pointer: cudaMalloc's devPtr), when read
    out0: int = 0
    #: ns spent inside those launches' calls (--gpu-launch-time; 0: not measured)
    launch_ns: int = 0
    #: bytes the probe copied beside the arguments: the 128-byte ncclUniqueId of
    #: ncclCommInitRank(Config) (bpf/calls.c); empty for other calls
    payload: bytes = b""
    #: the calling thread's total time off the CPU (ns, since its first NCCL collective) at
    #: the call's entry and at its return (bpf/ranks.c); -1: the thread is not clocked
    off_cpu_entry_ns: int = -1
    off_cpu_return_ns: int = -1
    #: NCCL collectives: the call's number on its (communicator handle, function) + 1, counted
    #: in the kernel since the handle's set-up or the probes' attaching (bpf/calls.c); 0: none
    comm_seq: int = 0


@dataclass(slots=True)
class LostEvents:
    """The source could not deliver ``count`` events (a source that learns of
    loss in-band; the eBPF source reads the kernel's counter instead)."""

    count: int
    ts_ns: int = 0


Event = (
    ConnOpen | ConnPeer | DataEvent | DatagramEvent | ConnClose | ProcessStart | ProcessExit | CallEvent | LostEvents
)

FAMILY_NAMES = {socket.AF_INET: "inet", socket.AF_INET6: "inet6", socket.AF_UNIX: "unix"}
