"""Cross-node propagation without a kernel (docs/cross-node.md): the modes and what a host
allows, the command line, the cgroup and the sockets user space finds, and the pipeline
binding the kernel's ids to the exchange they were fixed for.

The kernel side, the wire and both agents: tests/test_ebpf_crossnode.py."""

from __future__ import annotations

import os
import socket

import pytest

from otelbpf.cli.main import build_parser
from otelbpf.core.events import ContextOrigin, DataEvent, DataFlags, WireContext
from otelbpf.host import procfs
from otelbpf.sources import crossnode
from protocols.base import Direction
from tests.test_pipeline import GET, OK, accepted, connected, make_pipeline

IN, OUT = Direction.INGRESS, Direction.EGRESS
TRACE, SPAN = bytes(range(1, 17)), bytes(range(50, 58))


# -- modes and hosts -----------------------------------------------------------------------


def test_off_plans_nothing_and_compiles_nothing_in():
    plan = crossnode.plan("off")
    assert not plan.active and plan.cflags() == ["-DPROPAGATION=0"]
    assert "nothing is written" in plan.describe()


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="expected one of off, tcp, headers, all"):
        crossnode.plan("ip")


def test_a_kernel_without_the_sendmsg_tracepoint_leaves_propagation_off_and_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr(crossnode, "TRACEFS", tmp_path)
    monkeypatch.setattr(crossnode, "_kernel_version", lambda: (6, 12))
    plan = crossnode.plan("tcp", cgroup=str(tmp_path))
    assert not plan.active and "tcp_sendmsg_locked" in plan.describe() and "6.11" in plan.describe()


def test_a_kernel_older_than_6_10_cannot_tell_the_connecting_process(monkeypatch, tmp_path):
    monkeypatch.setattr(crossnode, "_kernel_version", lambda: (6, 6))
    plan = crossnode.plan("all", cgroup=str(tmp_path))
    assert not plan.active and "6.10" in plan.reasons[0]


def test_no_cgroup_v2_means_nowhere_to_attach(tmp_path):
    plan = crossnode.plan("tcp", cgroup=str(tmp_path / "missing"))
    assert not plan.active and "cgroup v2" in plan.reasons[0]


def test_the_cgroup_v2_mount_is_found_on_hybrid_and_unified_hosts(tmp_path):
    hybrid = tmp_path / "hybrid"
    hybrid.write_text(
        "30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
        "35 30 0:30 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
        "40 30 0:35 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
    )
    unified = tmp_path / "unified"
    unified.write_text("29 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw\n")
    nested = tmp_path / "nested"
    nested.write_text("29 23 0:26 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")  # a container's view
    assert crossnode.cgroup2_root(str(hybrid)) == "/sys/fs/cgroup/unified"
    assert crossnode.cgroup2_root(str(unified)) == "/sys/fs/cgroup"
    assert crossnode.cgroup2_root(str(nested)) is None
    assert crossnode.cgroup2_root(str(tmp_path / "none")) is None


@pytest.mark.skipif(crossnode.plan("tcp").bits == 0, reason="this kernel cannot propagate (the plan says why)")
def test_on_this_host_tcp_runs_with_struct_tcp_socks_offsets_from_btf():
    plan = crossnode.plan("tcp")
    assert plan.mode == "tcp" and plan.write_seq_offset and plan.copied_seq_offset
    assert "-DPROPAGATION=1" in plan.cflags() and f"-DTCP_WRITE_SEQ_OFF={plan.write_seq_offset}" in plan.cflags()
    headers = crossnode.plan("all")
    assert headers.bits == crossnode.PROP_TCP and headers.reasons == (crossnode.HEADERS_UNAVAILABLE,)


def test_the_command_line_defaults_to_tcp_and_the_environment_can_change_that(monkeypatch):
    assert build_parser().parse_args(["run", "--all"]).propagation == "tcp"
    assert build_parser().parse_args(["run", "--all", "--propagation", "off"]).propagation == "off"
    monkeypatch.setenv(crossnode.MODE_ENV, "off")
    assert build_parser().parse_args(["run", "--all"]).propagation == "off"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--all", "--propagation", "ip"])


def test_a_processs_listening_and_outgoing_sockets_are_found():
    listener = socket.create_server(("127.0.0.1", 0))
    wildcard = socket.create_server(("", 0))
    client = socket.create_connection(listener.getsockname())
    served, _ = listener.accept()
    try:
        ends = procfs.tcp_ends(os.getpid())
        found = {(family, address, port) for family, address, port in ends.listening}
        assert (socket.AF_INET, socket.inet_aton("127.0.0.1"), listener.getsockname()[1]) in found
        assert (socket.AF_INET, bytes(4), wildcard.getsockname()[1]) in found
        assert ends.outgoing >= 1  # the client's socket; the accepted one shares the listener's port
    finally:
        for s in (client, served, listener, wildcard):
            s.close()
    assert procfs.tcp_ends(2**22 + 7) == procfs.TcpEnds([], 0)


# -- the pipeline: each request's ids to its exchange ----------------------------------------


def sent(span_id: bytes = SPAN) -> WireContext:
    return WireContext(TRACE, span_id, 1, ContextOrigin.CLIENT, 0, 1)


def adopted() -> WireContext:
    return WireContext(TRACE, SPAN, 1, ContextOrigin.TCP_OPTION)


def event(ts, conn_id, pid, direction, payload, context=None, fd=5) -> DataEvent:
    flags = DataFlags.TRACE_CTX if context is not None else 0
    return DataEvent(ts, pid, pid, fd, conn_id, direction, len(payload), payload, flags, 0, 0, context)


def test_a_client_span_takes_the_ids_its_request_went_out_with():
    pipeline, out, _ = make_pipeline()
    pipeline.handle([connected(1, 100), event(10, 1, 100, OUT, GET, sent(), fd=6), event(20, 1, 100, IN, OK, fd=6)])
    [span] = out.spans
    assert (span.trace_id, span.span_id, span.parent_span_id) == (TRACE, SPAN, b"")


def test_a_server_span_is_the_child_of_the_span_its_option_named():
    pipeline, out, counters = make_pipeline()
    pipeline.handle([accepted(1, 200), event(10, 1, 200, IN, GET, adopted()), event(20, 1, 200, OUT, OK)])
    [span] = out.spans
    assert (span.trace_id, span.parent_span_id) == (TRACE, SPAN) and span.span_id != SPAN
    assert span.attributes["otelbpf.association"] == "tcp_option"
    assert counters.get("otelbpf.propagation.adopted") == 1


def test_each_request_of_a_keep_alive_connection_takes_its_own_ids_in_one_batch():
    pipeline, out, _ = make_pipeline()
    first, second = bytes(range(60, 68)), bytes(range(70, 78))
    pipeline.handle([
        connected(1, 100),
        event(10, 1, 100, OUT, GET, sent(first), fd=6), event(20, 1, 100, IN, OK, fd=6),
        event(30, 1, 100, OUT, GET, sent(second), fd=6), event(40, 1, 100, IN, OK, fd=6),
    ])  # fmt: skip
    assert [s.span_id for s in out.spans] == [first, second]


def test_ids_with_no_exchange_to_take_them_are_dropped_at_the_answer_and_counted():
    """A context on a write that started no exchange (what the kernel took for a
    request start was not one to the parser): the next request, written without one,
    must not take it; it went on the wire, so it is counted."""
    pipeline, out, counters = make_pipeline()
    pipeline.handle([
        connected(1, 100),
        event(10, 1, 100, OUT, GET, fd=6), event(20, 1, 100, IN, OK, fd=6),
        event(25, 1, 100, OUT, b"X", sent(), fd=6),  # not a request to the parser
        event(28, 1, 100, IN, b"", fd=6),
        event(30, 1, 100, OUT, GET, fd=6), event(40, 1, 100, IN, OK, fd=6),
    ])  # fmt: skip
    assert SPAN not in {s.span_id for s in out.spans}
    assert counters.get("otelbpf.propagation.unclaimed") == 1


def test_a_record_with_ids_is_not_counted_as_truncated():
    pipeline, _, counters = make_pipeline()
    pipeline.handle([connected(1, 100), event(10, 1, 100, OUT, GET, sent(), fd=6)])
    assert counters.get("otelbpf.payload.truncated") == 0


def test_the_first_request_of_a_connection_takes_its_ids_through_protocol_detection():
    """A connection's first bytes are held until a detector recognises them: the ids of
    the event that held them still reach the exchange started from it."""
    pipeline, out, _ = make_pipeline()
    half = GET[:10]
    pipeline.handle([
        connected(1, 100),
        event(10, 1, 100, OUT, half, sent(), fd=6), event(11, 1, 100, OUT, GET[10:], fd=6),
        event(20, 1, 100, IN, OK, fd=6),
    ])  # fmt: skip
    [span] = out.spans
    assert span.span_id == SPAN


def test_doctor_says_what_propagation_does_here():
    [line, *_] = crossnode.checks("off")
    assert line.name == "cross-node context" and line.status == "info" and "off" in line.detail
    found = crossnode.checks("tcp")
    assert found[0].name == "cross-node context"
    assert found[0].status in ("ok", "warn")


@pytest.mark.ebpf
def test_doctor_names_a_sockmap_program_another_tool_loaded():
    """A CNI's (or OBI's) sk_msg program, loaded and never attached here: doctor names it and
    says the TCP option leaves it be."""
    from bcc import BPF

    bpf = BPF(text=b"""
BPF_SOCKHASH(cni_socks, u64, 64);
int cni_redirect(struct sk_msg_md *msg) { return SK_PASS; }
""")
    try:
        bpf.load_func(b"cni_redirect", BPF.SK_MSG)
        check = crossnode._sockmap_check()
        assert "cni_redirect" in check.detail and "uses no sockmap" in check.detail
        assert check in crossnode.checks("tcp")
    finally:
        bpf.cleanup()
