"""Python mirror of bpf/capture.h: record layouts and decoding.

Kept apart from the loader so it can be tested (and used for replaying raw
records) without BCC. tests/test_ebpf_record_abi.py compiles capture.h and checks
these offsets against the C compiler's.

Also the one table of saved-user-register offsets per architecture
(:data:`SYSCALL_REGS`), which the loader passes to the C side as -D flags.
"""

from __future__ import annotations

import socket
import struct
from typing import Iterable

try:
    import cython
except ImportError:  # Cython not installed: run as plain Python

    class cython:  # type: ignore[no-redef]  # noqa: N801 - stands in for the module
        compiled = False

from otelbpf.core.events import (
    CallEvent,
    ConnClose,
    ConnOpen,
    ConnPeer,
    DataEvent,
    DatagramEvent,
    Event,
    LibraryLoad,
    ProcessExit,
    ProcessStart,
    RoleHint,
    WireContext,
)
from protocols.base import Direction

# struct event_hdr
HEADER = struct.Struct("<QQIIiBBBBIIQ")
# struct conn_info
CONN_INFO = struct.Struct("<HHHBB16s16s16sQQ")
# struct datagram_info
DATAGRAM_INFO = struct.Struct("<HHB3x16s")
# struct proc_info
PROC_INFO = struct.Struct("<16s256s")
# struct call_info
CALL_INFO = struct.Struct("<IIQ6QqQQQQQQQ")
#: call_info.call_flags: the off-CPU clocks were read (bpf/ranks.c)
CALL_INFO_CLOCKED = 1
# struct trace_ctx (after an EV_DATA record's payload when flagged DF_TRACE_CTX)
TRACE_CTX = struct.Struct("<16s8sBBBBI")

EV_DATA = 1
EV_CONN_OPEN = 2
EV_CONN_CLOSE = 3
EV_PROC_EXIT = 4
EV_CONN_PEER = 5
EV_DATAGRAM = 6
EV_PROC_START = 7
EV_CALL = 8
#: bpf/loader.c: a traced process's loader changed its link map (otelbpf/sources/loader.py)
EV_LIB_LOAD = 11

SOURCE_SOCKET = 0
SOURCE_TLS = 1

DF_SENDFILE = 1
DF_IOV_TRUNCATED = 2
DF_MMSG_UNKNOWN = 4
#: capture.h, whole capture of marked connections: one of several records of one call
DF_PIECE = 8
#: capture.h: a struct trace_ctx follows the payload (bpf/propagate.c)
DF_TRACE_CTX = 16
#: capture.h: the most of one call a marked connection has copied, and the records' piece
#: size (flat buffers; gathered calls' pieces span iovecs, at most WHOLE_GATHER_PIECE_BYTES).
WHOLE_CAPTURE_BYTES = 256 * 1024
WHOLE_PIECE_BYTES = 16384
WHOLE_GATHER_PIECE_BYTES = 12288

STAT_LOST = 0
STAT_IO_MAP_FULL = 1
STAT_NO_TUPLE = 2
STAT_MMSG_UNKNOWN = 3
STAT_CALL_DEPTH = 4
STAT_TLS_UNATTRIBUTED = 5
STAT_PROFILE_LOST = 6
# cross-node trace context (bpf/propagate.c)
STAT_CTX_WRITTEN = 7
STAT_CTX_NO_SPACE = 8
STAT_CTX_READ = 9
STAT_CTX_ADOPTED = 10
STAT_CTX_UNPLACED = 11
STAT_CTX_MISSING = 12
STAT_COUNT = 13
#: The kernel's context counters, by the name EbpfSource.kernel_stats gives them.
CONTEXT_STATS = {
    "ctx_written": STAT_CTX_WRITTEN,
    "ctx_no_space": STAT_CTX_NO_SPACE,
    "ctx_read": STAT_CTX_READ,
    "ctx_adopted": STAT_CTX_ADOPTED,
    "ctx_unplaced": STAT_CTX_UNPLACED,
    "ctx_missing": STAT_CTX_MISSING,
}

#: Offsets in the kernel's struct pt_regs (the saved user registers of a
#: syscall) per machine: the syscall number, the six syscall arguments and a
#: mode word telling native from 32-bit compat syscalls ((word & mask) ==
#: native). Passed to bpf/common.h as -DREG_*; tests/test_ebpf_record_abi.py
#: checks them against the C layouts.
#:
#: x86_64: r15 r14 r13 r12 bp bx r11 r10 r9 r8 ax cx dx si di orig_ax ip cs
#: flags sp ss (8 bytes each); arguments di si dx r10 r8 r9; nr in orig_ax;
#: cs is 0x33 (__USER_CS) for 64-bit syscalls.
#: aarch64: user_pt_regs {regs[31], sp, pc, pstate} then orig_x0, s32
#: syscallno; arguments x0..x5, but x0 is overwritten by the return value at
#: syscall exit, so argument 0 is read from orig_x0; pstate & PSR_MODE32_BIT
#: (0x10) marks a compat task.
SYSCALL_REGS: dict[str, dict[str, int]] = {
    "x86_64": {
        "NR": 120,
        "ARG0": 112,
        "ARG1": 104,
        "ARG2": 96,
        "ARG3": 56,
        "ARG4": 72,
        "ARG5": 64,
        "MODE": 136,
        "MODE_MASK": 0xFFFF,
        "MODE_NATIVE": 0x33,
    },
    "aarch64": {
        "NR": 280,
        "ARG0": 272,
        "ARG1": 8,
        "ARG2": 16,
        "ARG3": 24,
        "ARG4": 32,
        "ARG5": 40,
        "MODE": 264,
        "MODE_MASK": 0x10,
        "MODE_NATIVE": 0,
    },
}


def regs_cflags(machine: str) -> list[str]:
    """-D flags giving bpf/common.h the register offsets of ``machine`` (platform.machine())."""
    table = SYSCALL_REGS.get(machine)
    if table is None:
        raise ValueError(f"{machine}: no syscall register layout (supported: {', '.join(SYSCALL_REGS)})")
    flags = []
    for name, value in table.items():
        suffix = name if name.startswith("MODE_") else f"{name}_OFF"
        flags.append(f"-DREG_{suffix}={value:#x}")
    return flags

_DIRECTIONS = (Direction.INGRESS, Direction.EGRESS)

if cython.compiled:  # decode() reads headers through ebpf_layout.pxd's struct: it must be HEADER
    assert cython.sizeof(EventHeader) == HEADER.size, "ebpf_layout.pxd EventHeader differs from HEADER"


def format_address(family: int, raw: bytes) -> str:
    if family == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, raw[:4])
    if family == socket.AF_INET6:
        text = socket.inet_ntop(socket.AF_INET6, raw)
        # v4-mapped addresses (dual-stack sockets) read better as IPv4
        return text[7:] if text.startswith("::ffff:") and "." in text else text
    return ""


def wire_context(raw: bytes, offset: int) -> WireContext | None:
    """The struct trace_ctx at ``offset`` of ``raw`` (None when the record is too short)."""
    if len(raw) < offset + TRACE_CTX.size:
        return None
    trace_id, span_id, flags, origin, rule, carriers, _pad = TRACE_CTX.unpack_from(raw, offset)
    return WireContext(trace_id, span_id, flags, origin, rule, carriers)


class RecordDecoder:
    """Turns raw ring-buffer records into typed events.

    ``clock_offset_ns`` converts the kernel's CLOCK_MONOTONIC stamps to unix
    time; the loader refreshes it so NTP slew does not accumulate.
    """

    def __init__(self, clock_offset_ns: int = 0, probe_names: dict[int, tuple[str, str]] | None = None) -> None:
        self.clock_offset_ns = clock_offset_ns
        self.malformed = 0
        #: EV_CALL probe id -> (library, function); the uprobe attacher fills it.
        self.probe_names: dict[int, tuple[str, str]] = probe_names if probe_names is not None else {}

    def decode(self, records: Iterable[bytes]) -> list[Event]:
        out: list[Event] = []
        unpack_header = HEADER.unpack_from
        header_size = HEADER.size
        for raw in records:
            if cython.compiled and type(raw) is bytes:
                start = raw
                self.decode_at(cython.cast(cython.p_uchar, start), len(raw), raw, out)
                continue
            if len(raw) < header_size:
                self.malformed += 1
                continue
            ts, conn_id, tgid, tid, fd, kind, direction, flags, source, total, captured, task_id = unpack_header(raw)
            ts += self.clock_offset_ns
            if kind == EV_DATA:
                context = None
                if flags & DF_TRACE_CTX:
                    context = wire_context(raw, header_size + captured)
                    if context is None:
                        self.malformed += 1
                out.append(
                    DataEvent(
                        ts, tgid, tid, fd, conn_id, _DIRECTIONS[direction & 1], total,
                        raw[header_size : header_size + captured], flags, task_id, source, context,
                    )
                )  # fmt: skip
            else:
                self._decode_other(raw, kind, ts, conn_id, tgid, tid, fd, direction, flags, source, total, captured, task_id, out)
        return out

    def decode_at(self, record, size: int, raw, out: list) -> None:
        """Compiled build only: decode the record of ``size`` bytes at the address
        ``record`` (a ``bytes``' buffer, given as ``raw``, or the ring buffer's own memory,
        ``raw`` None: otelbpf/sources/ringbuf.py) into ``out``. The header is read in
        place as struct event_hdr (ebpf_layout.pxd), and a data record's payload is
        copied once, straight into its event; other records, rare, are decoded from a
        ``bytes`` copy. tests/test_compiled.py holds it to the plain-Python decode."""
        if cython.compiled:
            header_size = HEADER.size
            if size < header_size:
                self.malformed += 1
                return
            header = cython.cast(EventHeaderPtr, record)
            ts = header.ts_ns + self.clock_offset_ns
            kind = header.kind
            captured = header.captured_len
            if kind == EV_DATA:
                if captured > size - header_size:  # as a slice of the record would: cut at its end
                    captured = size - header_size
                # the C fields filled directly: no argument tuple to parse for the C __init__
                event = DataEvent.__new__(DataEvent)
                event.ts_ns = ts
                event.pid = header.tgid
                event.tid = header.tid
                event.fd = header.fd
                event.conn_id = header.conn_id
                event.direction = _DIRECTIONS[header.direction & 1]
                event.total_len = header.total_len
                event.data = PyBytes_FromStringAndSize(cython.cast(cython.p_char, record + header_size), captured)
                event.flags = header.flags
                event.task_id = header.task_id
                event.source = header.source
                if header.flags & DF_TRACE_CTX:  # after the payload: one request's ids (bpf/propagate.c)
                    if size - header_size - captured >= TRACE_CTX.size:
                        event.trace_ctx = wire_context(
                            PyBytes_FromStringAndSize(
                                cython.cast(cython.p_char, record + header_size + captured), TRACE_CTX.size
                            ),
                            0,
                        )
                    else:
                        self.malformed += 1
                out.append(event)
                return
            if raw is None:
                raw = PyBytes_FromStringAndSize(cython.cast(cython.p_char, record), size)
            self._decode_other(
                raw, kind, ts, header.conn_id, header.tgid, header.tid, header.fd, header.direction, header.flags,
                header.source, header.total_len, captured, header.task_id, out,
            )  # fmt: skip
        else:
            raise RuntimeError("decode_at reads memory: compiled build only (use decode)")

    def _decode_other(
        self, raw, kind, ts, conn_id, tgid, tid, fd, direction, flags, source, total, captured, task_id, out
    ) -> None:
        """Every record but stream data (``ts`` already on the wall clock), from its bytes."""
        header_size = HEADER.size
        offset = self.clock_offset_ns
        if kind == EV_DATAGRAM:
            out.append(self._datagram(raw, ts, tgid, tid, fd, conn_id, direction, flags, source, total, captured, task_id))
        elif kind == EV_CONN_OPEN:
            out.append(self._conn_open(raw, ts, tgid, tid, fd, conn_id))
        elif kind == EV_CONN_PEER:
            opened = self._conn_open(raw, ts, tgid, tid, fd, conn_id)
            out.append(ConnPeer(ts, tgid, tid, fd, conn_id, opened.peer_sock_id))
        elif kind == EV_CONN_CLOSE:
            out.append(ConnClose(ts, tgid, tid, fd, conn_id))
        elif kind == EV_PROC_EXIT:
            out.append(ProcessExit(ts, tgid))
        elif kind == EV_LIB_LOAD:
            out.append(LibraryLoad(ts, tgid))
        elif kind == EV_PROC_START:
            if len(raw) < header_size + PROC_INFO.size:
                self.malformed += 1
                return
            comm, filename = PROC_INFO.unpack_from(raw, header_size)
            out.append(
                ProcessStart(
                    ts,
                    tgid,
                    comm.split(b"\0", 1)[0].decode("utf-8", "replace"),
                    filename.split(b"\0", 1)[0].decode("utf-8", "surrogateescape"),
                )
            )
        elif kind == EV_CALL:
            if len(raw) < header_size + CALL_INFO.size:
                self.malformed += 1
                return
            (
                probe_id, call_flags, end_ns, a0, a1, a2, a3, a4, a5, ret, launches, first_launch, out0, launch_ns,
                off_cpu_entry, off_cpu_return, comm_seq,
            ) = CALL_INFO.unpack_from(raw, header_size)  # fmt: skip
            library, function = self.probe_names.get(probe_id, ("", f"probe#{probe_id}"))
            start = header_size + CALL_INFO.size
            clocked = call_flags & CALL_INFO_CLOCKED
            out.append(
                CallEvent(
                    ts, end_ns + offset, tgid, tid, library, function, (a0, a1, a2, a3, a4, a5), ret, task_id,
                    launches, first_launch + offset if first_launch else 0, out0, launch_ns,
                    bytes(raw[start : start + captured]) if captured else b"",
                    off_cpu_entry if clocked else -1, off_cpu_return if clocked else -1, comm_seq,
                )
            )
        else:
            self.malformed += 1

    def _datagram(self, raw, ts, tgid, tid, fd, conn_id, direction, flags, source, total, captured, task_id):
        start = HEADER.size + DATAGRAM_INFO.size
        if len(raw) < start:
            self.malformed += 1
            return DatagramEvent(ts, tgid, tid, fd, conn_id, _DIRECTIONS[direction & 1], total, b"", flags=flags)
        family, port, _proto, addr = DATAGRAM_INFO.unpack_from(raw, HEADER.size)
        return DatagramEvent(
            ts,
            tgid,
            tid,
            fd,
            conn_id,
            _DIRECTIONS[direction & 1],
            total,
            raw[start : start + captured],
            peer_addr=format_address(family, addr),
            peer_port=port,
            family=family,
            flags=flags,
            task_id=task_id,
            source=source,
        )

    def _conn_open(self, raw: bytes, ts: int, tgid: int, tid: int, fd: int, conn_id: int) -> ConnOpen:
        if len(raw) < HEADER.size + CONN_INFO.size:
            self.malformed += 1
            return ConnOpen(ts, tgid, tid, fd, conn_id)
        family, lport, pport, role, proto, laddr, paddr, comm, sock_id, peer_sock_id = CONN_INFO.unpack_from(
            raw, HEADER.size
        )
        return ConnOpen(
            ts_ns=ts,
            pid=tgid,
            tid=tid,
            fd=fd,
            conn_id=conn_id,
            family=family,
            local_addr=format_address(family, laddr),
            local_port=lport,  # inet_sock_set_state gives both in host order
            peer_port=pport,
            peer_addr=format_address(family, paddr),
            role_hint=RoleHint(role) if role in (0, 1, 2) else RoleHint.UNKNOWN,
            comm=comm.split(b"\0", 1)[0].decode("utf-8", "replace"),
            sock_id=sock_id,
            peer_sock_id=peer_sock_id,
            protocol=proto,
        )
