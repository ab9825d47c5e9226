"""Python mirror of bpf/capture.h: record layouts and decoding.

Kept apart from the loader so it can be tested (and used for replaying raw
records) without BCC. tests/test_ebpf_layout.py compiles capture.h and checks
these offsets against the C compiler's.
"""

from __future__ import annotations

import socket
import struct
from typing import Iterable

from otelbpf.events import ConnClose, ConnOpen, ConnPeer, DataEvent, Event, ProcessExit, RoleHint
from protocols.base import Direction

# struct event_hdr
HEADER = struct.Struct("<QQIIiBBHIIQ")
# struct conn_info
CONN_INFO = struct.Struct("<HHHBB16s16s16sQQ")

EV_DATA = 1
EV_CONN_OPEN = 2
EV_CONN_CLOSE = 3
EV_PROC_EXIT = 4
EV_CONN_PEER = 5

STAT_LOST = 0
STAT_IO_MAP_FULL = 1
STAT_NO_TUPLE = 2
STAT_COUNT = 3

_DIRECTIONS = (Direction.INGRESS, Direction.EGRESS)


def format_address(family: int, raw: bytes) -> str:
    if family == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, raw[:4])
    if family == socket.AF_INET6:
        text = socket.inet_ntop(socket.AF_INET6, raw)
        # v4-mapped addresses (dual-stack sockets) read better as IPv4
        return text[7:] if text.startswith("::ffff:") and "." in text else text
    return ""


class RecordDecoder:
    """Turns raw ring-buffer records into typed events.

    ``clock_offset_ns`` converts the kernel's CLOCK_MONOTONIC stamps to unix
    time; the loader refreshes it so NTP slew does not accumulate.
    """

    def __init__(self, clock_offset_ns: int = 0) -> None:
        self.clock_offset_ns = clock_offset_ns
        self.malformed = 0

    def decode(self, records: Iterable[bytes]) -> list[Event]:
        out: list[Event] = []
        unpack_header = HEADER.unpack_from
        header_size = HEADER.size
        offset = self.clock_offset_ns
        for raw in records:
            if len(raw) < header_size:
                self.malformed += 1
                continue
            ts, conn_id, tgid, tid, fd, kind, direction, flags, total, captured, task_id = unpack_header(raw)
            ts += offset
            if kind == EV_DATA:
                data = raw[header_size : header_size + captured]
                out.append(
                    DataEvent(
                        ts, tgid, tid, fd, conn_id, _DIRECTIONS[direction & 1], total, data, flags, task_id
                    )
                )
            elif kind == EV_CONN_OPEN:
                out.append(self._conn_open(raw, ts, tgid, tid, fd, conn_id))
            elif kind == EV_CONN_PEER:
                opened = self._conn_open(raw, ts, tgid, tid, fd, conn_id)
                out.append(ConnPeer(ts, tgid, tid, fd, conn_id, opened.peer_sock_id))
            elif kind == EV_CONN_CLOSE:
                out.append(ConnClose(ts, tgid, tid, fd, conn_id))
            elif kind == EV_PROC_EXIT:
                out.append(ProcessExit(ts, tgid))
            else:
                self.malformed += 1
        return out

    def _conn_open(self, raw: bytes, ts: int, tgid: int, tid: int, fd: int, conn_id: int) -> ConnOpen:
        if len(raw) < HEADER.size + CONN_INFO.size:
            self.malformed += 1
            return ConnOpen(ts, tgid, tid, fd, conn_id)
        family, lport, pport, role, _proto, laddr, paddr, comm, sock_id, peer_sock_id = CONN_INFO.unpack_from(
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
        )
