"""The Python decoder and bpf/capture.h must agree on every record layout.

Compiles a probe program with the host C compiler that prints the C offsets
and sizes, and compares them with the struct formats in ebpf_layout.py.
"""

import re
import shutil
import struct
import subprocess

import pytest

from otelbpf.core.events import (
    CallEvent,
    ConnClose,
    ConnOpen,
    ConnPeer,
    DataEvent,
    DatagramEvent,
    LibraryLoad,
    ProcessExit,
    ProcessStart,
    RoleHint,
)
from otelbpf.profiles.kinds import PROFILE_KINDS
from otelbpf.sources import ebpf_layout as layout
from otelbpf.sources.ebpf_program import BPF_DIR
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
    F(event_hdr, fd); F(event_hdr, type); F(event_hdr, direction); F(event_hdr, flags); F(event_hdr, source);
    F(event_hdr, total_len); F(event_hdr, captured_len); F(event_hdr, task_id);
    F(conn_info, family); F(conn_info, local_port); F(conn_info, peer_port); F(conn_info, role);
    F(conn_info, protocol); F(conn_info, local_addr); F(conn_info, peer_addr); F(conn_info, comm);
    F(conn_info, sock_id); F(conn_info, peer_sock_id);
    printf("datagram_info %zu\n", sizeof(struct datagram_info));
    F(datagram_info, family); F(datagram_info, peer_port); F(datagram_info, protocol); F(datagram_info, peer_addr);
    printf("proc_info %zu\n", sizeof(struct proc_info));
    F(proc_info, comm);
    F(proc_info, filename);
    printf("call_info %zu\n", sizeof(struct call_info));
    F(call_info, probe_id); F(call_info, call_flags); F(call_info, end_ns); F(call_info, args); F(call_info, ret);
    F(call_info, launches); F(call_info, first_launch_ns); F(call_info, out0); F(call_info, launch_ns);
    printf("trace_ctx %zu\n", sizeof(struct trace_ctx));
    F(trace_ctx, trace_id); F(trace_ctx, span_id); F(trace_ctx, flags); F(trace_ctx, origin); F(trace_ctx, rule);
    F(trace_ctx, carriers); F(trace_ctx, pad);
    F(call_info, off_cpu_entry_ns); F(call_info, off_cpu_return_ns); F(call_info, comm_seq);
#define C(name) printf(#name " %d\n", (int)(name))
    C(EV_DATA); C(EV_CONN_OPEN); C(EV_CONN_CLOSE); C(EV_PROC_EXIT); C(EV_CONN_PEER); C(EV_DATAGRAM); C(EV_PROC_START); C(EV_CALL);
    C(EV_LIB_LOAD);
    C(STAT_LOST); C(STAT_IO_MAP_FULL); C(STAT_NO_TUPLE); C(STAT_MMSG_UNKNOWN); C(STAT_CALL_DEPTH); C(STAT_TLS_UNATTRIBUTED); C(STAT_PROFILE_LOST); C(STAT_COUNT);
    C(STAT_CTX_WRITTEN); C(STAT_CTX_NO_SPACE); C(STAT_CTX_READ); C(STAT_CTX_ADOPTED); C(STAT_CTX_UNPLACED);
    C(STAT_CTX_MISSING); C(DF_TRACE_CTX);
    C(CTX_FRESH); C(CTX_TCP_OPTION); C(CTX_HEADER); C(CTX_CLIENT); C(CTX_RULE_ROOT); C(CTX_RULE_THREAD);
    C(CTX_RULE_PROCESS); C(CARRIER_TCP_OPTION);
    C(SOURCE_SOCKET); C(SOURCE_TLS); C(DF_SENDFILE); C(DF_IOV_TRUNCATED); C(DF_MMSG_UNKNOWN);
    C(DF_PIECE); C(WHOLE_CAPTURE_BYTES); C(WHOLE_PIECE_BYTES); C(WHOLE_GATHER_PIECE_BYTES);
    printf("profile_info %zu\n", sizeof(struct profile_info));
    F(profile_info, stack_addr); F(profile_info, kernel_stack_id); F(profile_info, py_count); F(profile_info, kind);
    F(profile_info, flags); F(profile_info, comm); F(profile_info, gpu_kernel); F(profile_info, gpu_host_function);
    F(profile_info, regs); F(profile_info, py);
    printf("gpu_kernel_name %zu\n", sizeof(struct gpu_kernel_name));
    F(gpu_kernel_name, handle); F(gpu_kernel_name, alias); F(gpu_kernel_name, name_addr); F(gpu_kernel_name, source);
    F(gpu_kernel_name, name);
    C(EV_GPU_KERNEL_NAME); C(PF_GPU_GRAPH); C(GPU_NAME_BYTES); C(GPU_NAME_MODULE_FUNCTION); C(GPU_NAME_LIBRARY_KERNEL);
    C(GPU_NAME_KERNEL_FUNCTION); C(GPU_NAME_REGISTERED); C(GPU_NAME_RUNTIME_KERNEL);
    printf("py_frame %zu\n", sizeof(struct py_frame));
    F(py_frame, code); F(py_frame, instr); F(py_frame, flags);
    printf("offcpu_end %zu\n", sizeof(struct offcpu_end));
    F(offcpu_end, blocked_ns);
    printf("py_offsets %zu\n", sizeof(struct py_offsets));
    F(py_offsets, version); F(py_offsets, tstate_frame); F(py_offsets, cframe_current_frame); F(py_offsets, frame_previous);
    F(py_offsets, frame_code); F(py_offsets, frame_instr); F(py_offsets, frame_owner); F(py_offsets, owner_kind);
    F(py_offsets, shim_owner); F(py_offsets, tstate_mode); F(py_offsets, tls_module); F(py_offsets, pad); F(py_offsets, tls_offset);
    C(PY_TSTATE_MAP); C(PY_TSTATE_FS); C(PY_TSTATE_DTV);
    C(EV_PROFILE); C(EV_OFFCPU_END);
    C(PROFILE_ON_CPU); C(PROFILE_OFF_CPU); C(PROFILE_GPU_CALL); C(PROFILE_GPU_LAUNCH);
    /* PROFILE_KINDS */
    C(PF_KERNEL_MODE); C(PF_PY_NO_THREAD); C(PF_PY_TRUNCATED); C(PF_STACK_TRUNCATED);
    C(PYF_EVAL_END); C(PYF_SHIM); C(PROFILE_PY_FRAMES); C(PROFILE_REGS); C(PROFILE_STACK_BYTES);
    return 0;
}
"""

# every kind of otelbpf/profiles/kinds.py's table, by its C name (an entry naming no member fails the compile)
PROBE = PROBE.replace("/* PROFILE_KINDS */", " ".join(f"C({kind.c_name});" for kind in PROFILE_KINDS))


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
    fields = ["ts_ns", "conn_id", "tgid", "tid", "fd", "type", "direction", "flags", "source", "total_len", "captured_len", "task_id"]
    assert [c_layout[f"event_hdr.{f}"] for f in fields] == _offsets_of(layout.HEADER.format)


def test_conn_info_matches_c(c_layout):
    assert c_layout["conn_info"] == (layout.CONN_INFO.size,)
    fields = ["family", "local_port", "peer_port", "role", "protocol", "local_addr", "peer_addr", "comm", "sock_id", "peer_sock_id"]
    assert [c_layout[f"conn_info.{f}"] for f in fields] == _offsets_of(layout.CONN_INFO.format)


def _fields_without_padding(fmt: str) -> str:
    return "<" + re.sub(r"\d*x", "", fmt.lstrip("<"))


def test_datagram_proc_and_call_records_match_c(c_layout):
    assert c_layout["datagram_info"] == (layout.DATAGRAM_INFO.size,)
    fields = ["family", "peer_port", "protocol", "peer_addr"]
    offsets = [c_layout[f"datagram_info.{f}"] for f in fields]
    assert offsets == [(0, 2), (2, 2), (4, 1), (8, 16)]  # 3 pad bytes after protocol ("3x")
    assert layout.DATAGRAM_INFO.unpack(bytes(range(24)))[3] == bytes(range(8, 24))
    assert c_layout["proc_info"] == (layout.PROC_INFO.size,) and c_layout["proc_info.comm"] == (0, 16)
    assert c_layout["proc_info.filename"] == (16, 256)
    assert c_layout["call_info"] == (layout.CALL_INFO.size,)
    fields = ["probe_id", "call_flags", "end_ns", "args", "ret", "launches", "first_launch_ns", "out0", "launch_ns",
              "off_cpu_entry_ns", "off_cpu_return_ns", "comm_seq"]
    assert [c_layout[f"call_info.{f}"] for f in fields] == [
        (0, 4), (4, 4), (8, 8), (16, 48), (64, 8), (72, 8), (80, 8), (88, 8), (96, 8), (104, 8), (112, 8), (120, 8),
    ]  # fmt: skip


def test_trace_context_matches_c(c_layout):
    """The ids an EV_DATA record carries after its payload (DF_TRACE_CTX, bpf/propagate.c)."""
    from otelbpf.core.events import ContextOrigin, DataFlags

    assert c_layout["trace_ctx"] == (layout.TRACE_CTX.size,)
    fields = ["trace_id", "span_id", "flags", "origin", "rule", "carriers", "pad"]
    assert [c_layout[f"trace_ctx.{f}"] for f in fields] == _offsets_of(layout.TRACE_CTX.format)
    assert c_layout["DF_TRACE_CTX"] == (layout.DF_TRACE_CTX,) == (DataFlags.TRACE_CTX,)
    for origin in ContextOrigin:
        assert c_layout[f"CTX_{origin.name}"] == (origin.value,), origin
    for name, index in layout.CONTEXT_STATS.items():
        assert c_layout[f"STAT_{name.upper()}"] == (index,), name


def test_a_record_with_a_trace_context_decodes_to_its_event():
    """The plain decoder (and, tests/test_compiled.py, the compiled one): the context after the payload."""
    payload = b"GET / HTTP/1.1\r\n\r\n"
    context = layout.TRACE_CTX.pack(bytes(range(16)), bytes(range(16, 24)), 1, 4, 1, 1, 0)
    header = layout.HEADER.pack(5, 9, 100, 101, 3, layout.EV_DATA, 1, layout.DF_TRACE_CTX, 0, len(payload), len(payload), 0)
    [event] = layout.RecordDecoder().decode([header + payload + context])
    assert event.data == payload
    assert (event.trace_ctx.trace_id, event.trace_ctx.span_id) == (bytes(range(16)), bytes(range(16, 24)))
    assert (event.trace_ctx.flags, event.trace_ctx.origin, event.trace_ctx.rule, event.trace_ctx.carriers) == (1, 4, 1, 1)
    cut = layout.RecordDecoder()
    [short] = cut.decode([header + payload + context[:10]])  # a context cut short: counted, not decoded
    assert short.trace_ctx is None and cut.malformed == 1


def test_constants_match_c(c_layout):
    names = (
        "EV_DATA EV_CONN_OPEN EV_CONN_CLOSE EV_PROC_EXIT EV_CONN_PEER EV_DATAGRAM EV_PROC_START EV_CALL EV_LIB_LOAD "
        "STAT_LOST STAT_IO_MAP_FULL STAT_NO_TUPLE STAT_MMSG_UNKNOWN STAT_CALL_DEPTH STAT_TLS_UNATTRIBUTED STAT_PROFILE_LOST STAT_COUNT "
        "SOURCE_SOCKET SOURCE_TLS DF_SENDFILE DF_IOV_TRUNCATED DF_MMSG_UNKNOWN "
        "DF_PIECE WHOLE_CAPTURE_BYTES WHOLE_PIECE_BYTES WHOLE_GATHER_PIECE_BYTES"
    ).split()
    for name in names:
        assert c_layout[name] == (getattr(layout, name),), name
    from otelbpf.core.events import DataFlags, Source

    assert (layout.SOURCE_SOCKET, layout.SOURCE_TLS) == (Source.SOCKET, Source.TLS)
    assert (layout.DF_SENDFILE, layout.DF_IOV_TRUNCATED, layout.DF_MMSG_UNKNOWN, layout.DF_PIECE) == (
        DataFlags.SENDFILE,
        DataFlags.IOV_TRUNCATED,
        DataFlags.MMSG_UNKNOWN,
        DataFlags.PIECE,
    )
    assert layout.WHOLE_CAPTURE_BYTES >= 256 * 1024  # the documented bound per call (capture.h)
    # a gathered call's pieces are built in a per-CPU scratch twice their size (socket.c), at most 32 KiB
    assert 2 * layout.WHOLE_GATHER_PIECE_BYTES + layout.HEADER.size <= 32768


def test_profile_constants_match_c(c_layout):
    """otelbpf/profiles/records.py's copy of capture.h's profile record kinds, flags and bounds."""
    from otelbpf.profiles import records

    names = (
        "EV_PROFILE EV_OFFCPU_END PROFILE_ON_CPU PROFILE_OFF_CPU PROFILE_GPU_CALL PROFILE_GPU_LAUNCH "
        "PF_KERNEL_MODE PF_PY_NO_THREAD PF_PY_TRUNCATED PF_STACK_TRUNCATED PF_GPU_GRAPH PYF_EVAL_END PYF_SHIM "
        "PROFILE_PY_FRAMES PROFILE_REGS PROFILE_STACK_BYTES EV_GPU_KERNEL_NAME GPU_NAME_BYTES GPU_NAME_MODULE_FUNCTION "
        "GPU_NAME_LIBRARY_KERNEL GPU_NAME_KERNEL_FUNCTION GPU_NAME_REGISTERED GPU_NAME_RUNTIME_KERNEL"
    ).split()
    for name in names:
        assert c_layout[name] == (getattr(records, name),), name
    # the profile record types do not collide with the socket ones
    assert len({getattr(layout, n) for n in ("EV_DATA EV_CONN_OPEN EV_CONN_CLOSE EV_PROC_EXIT EV_CONN_PEER "
                                               "EV_DATAGRAM EV_PROC_START EV_CALL EV_LIB_LOAD").split()}
               | {records.EV_PROFILE, records.EV_OFFCPU_END, records.EV_GPU_KERNEL_NAME}) == 12  # fmt: skip


def test_profile_kinds_table_matches_c(c_layout):
    """Each entry of otelbpf/profiles/kinds.py's table has its enum profile_kind value, and
    each member of the enum (bpf/capture.h) has an entry: a kind the kernel can send is one
    the profiler dispatches."""
    for kind in PROFILE_KINDS:
        assert c_layout[kind.c_name] == (kind.record_kind,), kind.name
    enum = re.search(r"enum profile_kind \{(.*?)\};", (BPF_DIR / "capture.h").read_text(), re.S)
    members = re.findall(r"^\s*(\w+)\s*=", enum.group(1), re.M)
    assert members and sorted(members) == sorted(kind.c_name for kind in PROFILE_KINDS)


def test_profile_records_match_c(c_layout):
    from otelbpf.profiles import records

    assert c_layout["profile_info"] == (records.PROFILE_INFO_SIZE,)
    head = ["stack_addr", "kernel_stack_id", "py_count", "kind", "flags", "comm", "gpu_kernel", "gpu_host_function", "regs"]
    # PROFILE_INFO_HEAD ("<QiHBB16sQQ21Q"): one format field per C field, regs the PROFILE_REGS words
    assert [c_layout[f"profile_info.{f}"] for f in head] == _offsets_of(records.PROFILE_INFO_HEAD.format)
    assert c_layout["profile_info.regs"][1] == records.PROFILE_REGS * 8
    assert c_layout["profile_info.py"] == (records.PROFILE_INFO_HEAD.size, records.PROFILE_PY_FRAMES * records.PY_FRAME.size)
    assert c_layout["py_frame"] == (records.PY_FRAME.size,)
    assert [c_layout[f"py_frame.{f}"] for f in ("code", "instr", "flags")] == _offsets_of(records.PY_FRAME.format)
    assert c_layout["offcpu_end"] == (records.OFFCPU_END.size,)
    assert c_layout["offcpu_end.blocked_ns"] == _offsets_of(records.OFFCPU_END.format)[0]
    # struct gpu_kernel_name: GPU_KERNEL_NAME ("<QQQB7x"), then the name bytes
    assert c_layout["gpu_kernel_name"] == (records.GPU_KERNEL_NAME.size + records.GPU_NAME_BYTES,)
    assert [c_layout[f"gpu_kernel_name.{f}"] for f in ("handle", "alias", "name_addr", "source")] == _offsets_of(
        _fields_without_padding(records.GPU_KERNEL_NAME.format))
    assert c_layout["gpu_kernel_name.name"] == (records.GPU_KERNEL_NAME.size, records.GPU_NAME_BYTES)


def test_python_offsets_match_c(c_layout):
    """The py_procs value user space writes (otelbpf/profiles/python/offsets.py) is bpf/capture.h's
    struct py_offsets, and the thread-state modes are the same numbers on both sides."""
    from otelbpf.profiles.python import offsets
    from otelbpf.profiles.python import thread_local as tls

    fields = ["version", "tstate_frame", "cframe_current_frame", "frame_previous", "frame_code", "frame_instr",
              "frame_owner", "owner_kind", "shim_owner", "tstate_mode", "tls_module", "pad", "tls_offset"]  # fmt: skip
    assert c_layout["py_offsets"] == (offsets.PY_OFFSETS.size,)
    assert [c_layout[f"py_offsets.{f}"] for f in fields] == _offsets_of(offsets.PY_OFFSETS.format)
    assert [c_layout[n][0] for n in ("PY_TSTATE_MAP", "PY_TSTATE_FS", "PY_TSTATE_DTV")] == [tls.MODE_NONE, tls.MODE_FS, tls.MODE_DTV]


# -- saved user registers (ebpf_layout.SYSCALL_REGS) ---------------------------

# arm64's struct pt_regs (arch/arm64/include/asm/ptrace.h), written out with
# fixed-width types so the host compiler lays it out as the kernel does.
ARM64_REGS = r"""
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
struct user_pt_regs { uint64_t regs[31]; uint64_t sp; uint64_t pc; uint64_t pstate; };
struct pt_regs {
    union { struct user_pt_regs user_regs; struct { uint64_t regs[31]; uint64_t sp; uint64_t pc; uint64_t pstate; }; };
    uint64_t orig_x0;
    int32_t syscallno;
    uint32_t unused2;
    uint64_t sdei_ttbr1;
    uint64_t pmr_save;
    uint64_t stackframe[2];
    uint64_t lockdep_hardirqs;
    uint64_t exit_rcu;
};
int main(void) {
    printf("NR %zu\nARG0 %zu\nMODE %zu\n", offsetof(struct pt_regs, syscallno), offsetof(struct pt_regs, orig_x0), offsetof(struct pt_regs, pstate));
    for (int i = 1; i < 6; i++) printf("ARG%d %zu\n", i, offsetof(struct pt_regs, regs) + i * sizeof(uint64_t));
    printf("user_pt_regs %zu\n", sizeof(struct user_pt_regs));
    return 0;
}
"""

# x86-64: the kernel's struct pt_regs has the order of <sys/user.h>'s
# user_regs_struct up to ss (the ptrace ABI copies one into the other).
X86_REGS = r"""
#include <stdio.h>
#include <stddef.h>
#include <sys/user.h>
#define O(n, f) printf(n " %zu\n", offsetof(struct user_regs_struct, f))
int main(void) {
    O("NR", orig_rax); O("ARG0", rdi); O("ARG1", rsi); O("ARG2", rdx); O("ARG3", r10); O("ARG4", r8); O("ARG5", r9); O("MODE", cs);
    return 0;
}
"""


def _run_c(tmp_path, source: str) -> dict[str, int]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    (tmp_path / "regs.c").write_text(source)
    subprocess.run([cc, "-o", str(tmp_path / "regs"), str(tmp_path / "regs.c")], check=True)
    out = subprocess.run([str(tmp_path / "regs")], check=True, capture_output=True, text=True).stdout
    return {name: int(value) for name, value in (line.split() for line in out.splitlines())}


def test_aarch64_register_offsets_match_the_arm64_pt_regs_layout(tmp_path):
    got = _run_c(tmp_path, ARM64_REGS)
    table = layout.SYSCALL_REGS["aarch64"]
    assert got.pop("user_pt_regs") == 34 * 8  # regs[31], sp, pc, pstate
    assert {k: table[k] for k in got} == got
    # documented values (arch/arm64/include/asm/ptrace.h, S_ORIG_X0 / S_SYSCALLNO)
    assert (table["ARG0"], table["NR"], table["MODE"]) == (272, 280, 264)
    assert (table["MODE_MASK"], table["MODE_NATIVE"]) == (0x10, 0)  # PSR_MODE32_BIT clear


def test_x86_64_register_offsets_match_the_ptrace_layout(tmp_path):
    import platform

    if platform.machine() != "x86_64":
        pytest.skip("<sys/user.h> describes x86-64 registers only on x86-64")
    got = _run_c(tmp_path, X86_REGS)
    table = layout.SYSCALL_REGS["x86_64"]
    assert {k: table[k] for k in got} == got
    assert (table["MODE_MASK"], table["MODE_NATIVE"]) == (0xFFFF, 0x33)  # __USER_CS


def test_regs_cflags_cover_every_macro_common_h_needs():
    text = (BPF_DIR / "common.h").read_text()
    needed = set(re.findall(r"\b(REG_[A-Z0-9_]+)\b", text))
    for machine in layout.SYSCALL_REGS:
        given = {flag[2:].split("=")[0] for flag in layout.regs_cflags(machine)}
        assert needed <= given, (machine, needed - given)
    with pytest.raises(ValueError):
        layout.regs_cflags("sparc64")


def _record(kind, payload=b"", direction=0, flags=0, total=None, conn_id=7, fd=5, source=0, info=b""):
    header = layout.HEADER.pack(
        1_000, conn_id, 100, 101, fd, kind, direction, flags, source, total if total is not None else len(payload), len(payload), 77
    )
    return header + info + payload


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
            _record(layout.EV_LIB_LOAD),
            b"short",
            _record(99),
        ]
    )
    assert [type(e) for e in events] == [ConnOpen, DataEvent, ConnPeer, ConnClose, ProcessExit, LibraryLoad]
    assert (events[5].ts_ns, events[5].pid) == (1_005, 100)
    assert (events[0].sock_id, events[0].peer_sock_id) == (11, 22)
    assert events[2].peer_sock_id == 22
    opened, data = events[0], events[1]
    assert (opened.ts_ns, opened.pid, opened.tid, opened.fd, opened.conn_id) == (1_005, 100, 101, 5, 7)
    assert (opened.local_addr, opened.local_port, opened.peer_addr, opened.peer_port) == ("127.0.0.1", 8080, "10.0.0.2", 40000)
    assert opened.role_hint == RoleHint.ACCEPTED and opened.comm == "python3"
    assert data.direction == Direction.INGRESS and data.data == b"GET / HTTP/1.1\r\n"
    assert data.total_len == 100 and data.missing == 100 - 16
    assert data.task_id == 77 and data.source == 0
    assert decoder.malformed == 2


def test_decode_datagram_process_start_and_call():
    decoder = layout.RecordDecoder(clock_offset_ns=5, probe_names={3: ("libcudart.so.12", "cudaMalloc")})
    peer = layout.DATAGRAM_INFO.pack(10, 5353, 17, bytes(15) + b"\x01")
    call = layout.CALL_INFO.pack(3, 0, 2_000, 1, 2, 3, 4, 5, 6, -12, 7, 1_500, 0xABC, 640, 11, 12, 0)
    unique_id = bytes(range(128))
    clocked = layout.CALL_INFO.pack(4, layout.CALL_INFO_CLOCKED, 3_000, *(0,) * 11, 1_000, 4_000, 42)
    events = decoder.decode(
        [
            _record(layout.EV_DATAGRAM, b"dns?", direction=1, total=40, info=peer, source=1),
            _record(layout.EV_PROC_START, info=layout.PROC_INFO.pack(b"nginx", b"/usr/sbin/nginx")),
            _record(layout.EV_CALL, info=call),
            _record(layout.EV_CALL, info=layout.CALL_INFO.pack(9, 0, 1_000, *(0,) * 14)),
            _record(layout.EV_DATA, b"x", source=1),
            _record(layout.EV_CALL, unique_id, info=clocked),
        ]
    )
    assert [type(e) for e in events] == [DatagramEvent, ProcessStart, CallEvent, CallEvent, DataEvent, CallEvent]
    dgram, start, call_event, unknown, data, with_id = events
    # not clocked: the off-CPU words are not read; the payload of an ncclUniqueId and the kernel's count are
    assert (call_event.off_cpu_entry_ns, call_event.off_cpu_return_ns, call_event.payload, call_event.comm_seq) == (-1, -1, b"", 0)
    assert (with_id.off_cpu_entry_ns, with_id.off_cpu_return_ns, with_id.payload, with_id.comm_seq) == (1_000, 4_000, unique_id, 42)
    assert (dgram.peer_addr, dgram.peer_port, dgram.family, dgram.data) == ("::1", 5353, 10, b"dns?")
    assert dgram.direction == Direction.EGRESS and dgram.missing == 36 and dgram.source == 1 and dgram.task_id == 77
    assert (start.pid, start.comm, start.ts_ns, start.exe) == (100, "nginx", 1_005, "/usr/sbin/nginx")
    assert (call_event.library, call_event.function, call_event.args, call_event.ret) == (
        "libcudart.so.12",
        "cudaMalloc",
        (1, 2, 3, 4, 5, 6),
        -12,
    )
    assert (call_event.ts_ns, call_event.end_ns, call_event.tid) == (1_005, 2_005, 101)
    assert (call_event.launches, call_event.first_launch_ns, call_event.out0, call_event.launch_ns) == (7, 1_505, 0xABC, 640)
    assert unknown.function == "probe#9" and unknown.first_launch_ns == 0  # no launch: no time to convert
    assert data.source == 1


def test_v4_mapped_ipv6_reads_as_ipv4():
    mapped = bytes(10) + b"\xff\xff" + bytes([192, 168, 1, 9])
    assert layout.format_address(10, mapped) == "192.168.1.9"
    assert layout.format_address(10, bytes(15) + b"\x01") == "::1"
