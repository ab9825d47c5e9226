"""The Python decoder and bpf/capture.h must agree on every record layout.

Compiles a probe program with the host C compiler that prints the C offsets
and sizes, and compares them with the struct formats in ebpf_layout.py.
"""

import re
import shutil
import struct
import subprocess

import pytest

from otelbpf.events import ConnClose, ConnOpen, ConnPeer, DataEvent, ProcessExit, RoleHint
from otelbpf.sources import ebpf_layout as layout
from otelbpf.sources.ebpf import BPF_DIR
from protocols.base import Direction

PROBE = r"""
#include <stdio.h>
#include <stddef.h>
#include <linux/types.h>
#include "capture.h"
#define F(s, f) printf(#s "." #f " %zu %zu\n", offsetof(struct s, f), sizeof(((struct s *)0)->f))
int main(void) {
    printf("event_hdr %zu\n", sizeof(struct event_hdr));
    printf("conn_info %zu\n", sizeof(struct conn_info));
    F(event_hdr, ts_ns); F(event_hdr, conn_id); F(event_hdr, tgid); F(event_hdr, tid);
    F(event_hdr, fd); F(event_hdr, type); F(event_hdr, direction); F(event_hdr, flags);
    F(event_hdr, total_len); F(event_hdr, captured_len); F(event_hdr, task_id);
    F(conn_info, family); F(conn_info, local_port); F(conn_info, peer_port); F(conn_info, role);
    F(conn_info, protocol); F(conn_info, local_addr); F(conn_info, peer_addr); F(conn_info, comm);
    F(conn_info, sock_id); F(conn_info, peer_sock_id);
    printf("EV_DATA %d\nEV_CONN_OPEN %d\nEV_CONN_CLOSE %d\nEV_PROC_EXIT %d\nEV_CONN_PEER %d\n", EV_DATA, EV_CONN_OPEN, EV_CONN_CLOSE, EV_PROC_EXIT, EV_CONN_PEER);
    printf("STAT_LOST %d\nSTAT_IO_MAP_FULL %d\nSTAT_NO_TUPLE %d\nSTAT_COUNT %d\n", STAT_LOST, STAT_IO_MAP_FULL, STAT_NO_TUPLE, STAT_COUNT);
    return 0;
}
"""


def _offsets_of(fmt: str) -> list[tuple[int, int]]:
    """(offset, size) of each field of a packed little-endian struct format."""
    out, offset = [], 0
    for count, code in re.findall(r"(\d*)([a-zA-Z])", fmt.lstrip("<")):
        size = struct.calcsize("<" + (count or "") + code)
        out.append((offset, size))
        offset += size
    return out


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to check the layout with")
    tmp = tmp_path_factory.mktemp("layout")
    (tmp / "probe.c").write_text(PROBE)
    subprocess.run([cc, f"-I{BPF_DIR}", "-o", str(tmp / "probe"), str(tmp / "probe.c")], check=True)
    lines = subprocess.run([str(tmp / "probe")], check=True, capture_output=True, text=True).stdout.splitlines()
    result = {}
    for line in lines:
        name, *nums = line.split()
        result[name] = tuple(int(n) for n in nums)
    return result


def test_header_matches_c(c_layout):
    assert c_layout["event_hdr"] == (layout.HEADER.size,)
    fields = ["ts_ns", "conn_id", "tgid", "tid", "fd", "type", "direction", "flags", "total_len", "captured_len", "task_id"]
    assert [c_layout[f"event_hdr.{f}"] for f in fields] == _offsets_of(layout.HEADER.format)


def test_conn_info_matches_c(c_layout):
    assert c_layout["conn_info"] == (layout.CONN_INFO.size,)
    fields = ["family", "local_port", "peer_port", "role", "protocol", "local_addr", "peer_addr", "comm", "sock_id", "peer_sock_id"]
    assert [c_layout[f"conn_info.{f}"] for f in fields] == _offsets_of(layout.CONN_INFO.format)


def test_constants_match_c(c_layout):
    for name in ("EV_DATA", "EV_CONN_OPEN", "EV_CONN_CLOSE", "EV_PROC_EXIT", "EV_CONN_PEER", "STAT_LOST", "STAT_IO_MAP_FULL", "STAT_NO_TUPLE", "STAT_COUNT"):
        assert c_layout[name] == (getattr(layout, name),), name


def _record(kind, payload=b"", direction=0, flags=0, total=None, conn_id=7, fd=5):
    header = layout.HEADER.pack(
        1_000, conn_id, 100, 101, fd, kind, direction, flags, total if total is not None else len(payload), len(payload), 77
    )
    return header + payload


def test_decode_every_record_type():
    decoder = layout.RecordDecoder(clock_offset_ns=5)
    info = layout.CONN_INFO.pack(
        2, 8080, 40000, 1, 6, bytes([127, 0, 0, 1]) + bytes(12), bytes([10, 0, 0, 2]) + bytes(12), b"python3\0".ljust(16, b"\0"), 11, 22
    )
    events = decoder.decode(
        [
            _record(layout.EV_CONN_OPEN, info),
            _record(layout.EV_DATA, b"GET / HTTP/1.1\r\n", direction=0, total=100),
            _record(layout.EV_CONN_PEER, info),
            _record(layout.EV_CONN_CLOSE),
            _record(layout.EV_PROC_EXIT),
            b"short",
            _record(99),
        ]
    )
    assert [type(e) for e in events] == [ConnOpen, DataEvent, ConnPeer, ConnClose, ProcessExit]
    assert (events[0].sock_id, events[0].peer_sock_id) == (11, 22)
    assert events[2].peer_sock_id == 22
    opened, data = events[0], events[1]
    assert (opened.ts_ns, opened.pid, opened.tid, opened.fd, opened.conn_id) == (1_005, 100, 101, 5, 7)
    assert (opened.local_addr, opened.local_port, opened.peer_addr, opened.peer_port) == ("127.0.0.1", 8080, "10.0.0.2", 40000)
    assert opened.role_hint == RoleHint.ACCEPTED and opened.comm == "python3"
    assert data.direction == Direction.INGRESS and data.data == b"GET / HTTP/1.1\r\n"
    assert data.total_len == 100 and data.missing == 100 - 16
    assert data.task_id == 77
    assert decoder.malformed == 2


def test_v4_mapped_ipv6_reads_as_ipv4():
    mapped = bytes(10) + b"\xff\xff" + bytes([192, 168, 1, 9])
    assert layout.format_address(10, mapped) == "192.168.1.9"
    assert layout.format_address(10, bytes(15) + b"\x01") == "::1"
