"""otelbpf.sources.btf: the BTF reader, on a synthetic blob and on this
machine's kernel BTF; and that the agent hooks socket I/O with raw
tracepoints (BTF offsets) where the kernel allows."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from otelbpf.sources import btf

VMLINUX = Path(btf.VMLINUX)


class Blob:
    """Builds a little-endian BTF blob type by type (ids from 1)."""

    def __init__(self) -> None:
        self.strings = bytearray(b"\0")
        self.types = bytearray()
        self.count = 0

    def s(self, name: str) -> int:
        if not name:
            return 0
        off = len(self.strings)
        self.strings += name.encode() + b"\0"
        return off

    def add(self, name: str, kind: int, vlen: int, size_or_type: int, extra: bytes = b"", kind_flag: bool = False) -> int:
        info = (kind << 24) | vlen | (1 << 31 if kind_flag else 0)
        self.types += struct.pack("<III", self.s(name), info, size_or_type) + extra
        self.count += 1
        return self.count

    def int_(self, name: str, size: int, bits: int | None = None, offset: int = 0) -> int:
        return self.add(name, btf.KIND_INT, 0, size, struct.pack("<I", (offset << 16) | (bits if bits is not None else size * 8)))

    def struct(self, name: str, size: int, members: list[tuple[str, int, int, int]], union: bool = False) -> int:
        """members: (name, type id, bit offset, bitfield size or 0)."""
        kind_flag = any(m[3] for m in members)
        extra = b"".join(
            struct.pack("<III", self.s(n), t, (bf << 24 | off) if kind_flag else off) for n, t, off, bf in members
        )
        return self.add(name, btf.KIND_UNION if union else btf.KIND_STRUCT, len(members), size, extra, kind_flag)

    def bytes(self) -> bytes:
        header = struct.pack("<HBBIIIII", btf.MAGIC, 1, 0, 24, 0, len(self.types), len(self.types), len(self.strings))
        return header + bytes(self.types) + bytes(self.strings)


def synthetic() -> btf.Btf:
    b = Blob()
    u8 = b.int_("unsigned char", 1)  # 1
    u16 = b.int_("unsigned short", 2)  # 2
    u32 = b.int_("unsigned int", 4)  # 3
    typedef_u16 = b.add("u16", btf.KIND_TYPEDEF, 0, u16)  # 4
    const_u16 = b.add("", btf.KIND_CONST, 0, typedef_u16)  # 5
    # struct common { u32 hash; union { u32 a; struct { u16 lo; u16 hi; }; }; unsigned short family; }
    anon_inner = b.struct("", 4, [("lo", u16, 0, 0), ("hi", u16, 16, 0)])  # 6
    anon_union = b.struct("", 4, [("a", u32, 0, 0), ("", anon_inner, 0, 0)], union=True)  # 7
    common = b.struct("common", 12, [("hash", u32, 0, 0), ("", anon_union, 32, 0), ("family", u16, 64, 0)])  # 8
    common_t = b.add("common_t", btf.KIND_TYPEDEF, 0, common)  # 9
    # struct outer { common_t c; u8 flags:4, kind:4; u8 whole:8; const u16 proto; u32 odd:12 }
    b.struct(
        "outer",
        24,
        [("c", common_t, 0, 0), ("flags", u8, 96, 4), ("kind", u8, 100, 4), ("whole", u8, 104, 8), ("proto", const_u16, 112, 0), ("odd", u32, 128, 12)],
    )  # 10
    b.add("outer", btf.KIND_FWD, 0, 0)  # 11: a forward declaration of the same name
    ptr_outer = b.add("", btf.KIND_PTR, 0, 10)  # 12
    int_t = b.int_("int", 4)  # 13
    void_ptr = b.add("", btf.KIND_PTR, 0, 0)  # 14
    proto = b.add("", btf.KIND_FUNC_PROTO, 4, 0, struct.pack("<IIIIIIII", 0, void_ptr, 0, ptr_outer, 0, int_t, 0, int_t))  # 15
    fn_ptr = b.add("", btf.KIND_PTR, 0, proto)  # 16
    b.add("btf_trace_outer_event", btf.KIND_TYPEDEF, 0, fn_ptr)  # 17
    # an old-style bitfield: an int type 3 bits wide
    three_bits = b.int_("u3", 1, bits=3)  # 18
    b.struct("legacy", 1, [("small", three_bits, 0, 0)])  # 19
    b.add("", btf.KIND_ARRAY, 0, 0, struct.pack("<III", u16, u32, 5))  # 20: u16[5]
    return btf.Btf(b.bytes())


def test_synthetic_members():
    types = synthetic()
    assert len(types) == 20
    family = types.member("common", "family")
    assert (family.offset, family.type_size, family.bitfield) == (8, 2, False)
    # through a typedef'd struct, then anonymous union / struct members
    hi = types.member("outer", "c.hi")
    assert (hi.bit_offset, hi.bit_size) == (48, 16)
    assert types.member("outer", "c.a").offset == 4
    assert types.member("outer", "c.family").byte_field() == (8, 2)
    proto = types.member("outer", "proto")
    assert proto.byte_field() == (14, 2)
    assert proto.type_name == "const u16"
    assert types.size_of(20) == 10
    assert types.struct_id("outer") == 10  # the definition, not the FWD


def test_synthetic_bitfields():
    types = synthetic()
    flags = types.member("outer", "flags")
    assert (flags.bit_offset, flags.bit_size, flags.bitfield) == (96, 4, True)
    with pytest.raises(btf.BtfError, match="bitfield"):
        flags.byte_field()
    with pytest.raises(btf.BtfError, match="bitfield"):
        types.member("outer", "kind").byte_field()
    # a byte-aligned bitfield as wide as a byte can be read as a whole
    assert types.member("outer", "whole").byte_field() == (13, 1)
    with pytest.raises(btf.BtfError):
        types.member("outer", "odd").byte_field()
    small = types.member("legacy", "small")
    assert small.bitfield and small.bit_size == 3


def test_synthetic_errors_and_prototypes():
    types = synthetic()
    with pytest.raises(btf.BtfError, match="no member c.nope"):
        types.member("outer", "c.nope")
    with pytest.raises(btf.BtfError, match="no struct missing"):
        types.member("missing", "x")
    with pytest.raises(btf.BtfError, match="not a struct"):
        types.member("outer", "proto.x")
    assert types.raw_tracepoint_args("outer_event") == ["struct outer *", "int", "int"]
    with pytest.raises(btf.BtfError, match="no btf_trace_nope"):
        types.raw_tracepoint_args("nope")
    with pytest.raises(btf.BtfError, match="magic"):
        btf.Btf(b"\0" * 32)
    with pytest.raises(btf.BtfError):
        btf.load("/nonexistent/vmlinux")


needs_btf = pytest.mark.skipif(not os.access(VMLINUX, os.R_OK), reason="no readable /sys/kernel/btf/vmlinux")


@needs_btf
def test_kernel_btf_sock_offsets():
    types = btf.load()
    assert btf.load() is types  # parsed once
    assert len(types) > 10000
    family = types.member("sock", "__sk_common.skc_family")
    assert family.byte_field()[1] == 2 and not family.bitfield
    protocol = types.member("sock", "sk_protocol")
    assert protocol.byte_field()[1] in (1, 2)
    # struct sock_common is struct sock's first member: same offset either way
    assert types.member("sock_common", "skc_family").offset == family.offset
    assert types.member("sock", "__sk_common").offset == 0
    for tracepoint in ("sock_recv_length", "sock_send_length"):
        assert types.raw_tracepoint_args(tracepoint) == ["struct sock *", "int", "int"]


@needs_btf
def test_kernel_btf_parse_is_cheap():
    code = "import time; t=time.perf_counter(); from otelbpf.sources import btf; b=btf.load(); b.member('sock','sk_protocol'); print(time.perf_counter()-t)"
    seconds = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert seconds < 5  # ~0.1 s here; generous for slow CI machines (timing is bench/'s business)


@needs_btf
def test_plan_uses_raw_tracepoints_and_env_forces_classic(monkeypatch):
    from otelbpf.sources.ebpf_program import SOCK_TRACEPOINTS_ENV, plan_sock_capture

    monkeypatch.delenv(SOCK_TRACEPOINTS_ENV, raising=False)
    plan = plan_sock_capture()
    assert plan.raw, plan.reason
    assert "-DSOCK_RAW_TP=1" in plan.cflags()
    assert f"-DSK_PROTOCOL_OFF={plan.protocol_offset}" in plan.cflags()
    monkeypatch.setenv(SOCK_TRACEPOINTS_ENV, "classic")
    assert not plan_sock_capture().raw
    monkeypatch.setenv(SOCK_TRACEPOINTS_ENV, "auto")
    assert not plan_sock_capture("/nonexistent/vmlinux").raw


def _start_source(pid: int):
    from otelbpf.sources.ebpf import CaptureConfig, EbpfSource

    source = EbpfSource(CaptureConfig(pids=[pid], python_tasks=False))
    source.start()
    return source


@pytest.mark.ebpf
def test_agent_attaches_raw_sock_tracepoints(monkeypatch):
    """On this machine (BTF present) the fast path is the one used."""
    from otelbpf.sources.ebpf_program import SOCK_TRACEPOINTS_ENV

    monkeypatch.delenv(SOCK_TRACEPOINTS_ENV, raising=False)
    idle = subprocess.Popen(["sleep", "60"])
    source = None
    try:
        source = _start_source(idle.pid)
        assert source.sock_capture is not None and source.sock_capture.raw, source.sock_capture
        raw = set(source._bpf.raw_tracepoint_fds)  # noqa: SLF001
        classic = set(source._bpf.tracepoint_fds)  # noqa: SLF001
        assert {b"sock_recv_length", b"sock_send_length"} <= raw
        assert not {b"sock:sock_recv_length", b"sock:sock_send_length"} & classic
    finally:
        if source is not None:
            source.close()
        idle.kill()
        idle.wait()


@pytest.mark.ebpf
def test_wrong_offsets_fall_back_to_classic(monkeypatch):
    """The start-up check on live sockets catches offsets that read wrong."""
    from otelbpf.sources import ebpf
    from otelbpf.sources.ebpf_program import SockCapture, plan_sock_capture

    good = plan_sock_capture()
    if not good.raw:
        pytest.skip(f"no raw path here: {good.reason}")
    wrong = SockCapture(True, "test: wrong offsets", good.family_offset + 2, good.protocol_offset, good.protocol_size)
    monkeypatch.setattr(ebpf, "plan_sock_capture", lambda: wrong)  # where EbpfSource.start looks it up
    idle = subprocess.Popen(["sleep", "60"])
    source = None
    try:
        source = _start_source(idle.pid)
        assert not source.sock_capture.raw
        assert "BTF offsets read" in source.sock_capture.reason
        assert b"sock:sock_send_length" in source._bpf.tracepoint_fds  # noqa: SLF001
    finally:
        if source is not None:
            source.close()
        idle.kill()
        idle.wait()
