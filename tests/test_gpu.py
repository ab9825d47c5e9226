"""GPU call semantics and library finding, without eBPF (tests/test_ebpf_gpu.py runs them for real)."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
from hypothesis import given, settings, strategies as st
from test_pipeline import IN, OUT, Metered, accepted, data, make_pipeline

from conftest import ROOT
from otelbpf.durations import parse_duration_ns
from otelbpf.core.events import CallEvent, ProcessStart
from otelbpf.core.model import StatusCode
from otelbpf.semantics import gpu, gpu_functions, nccl_lateness
from otelbpf.sources import gpu as gpu_probes
from otelbpf.sources.libraries import is_candidate
from otelbpf.sources.uprobes import ProbeSpec, resolve_symbols

STANDIN = ROOT / "examples" / "cuda_standin"
GET = b"GET /infer HTTP/1.1\r\nHost: x\r\n\r\n"
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


@pytest.fixture(scope="module")
def standin():
    subprocess.run(["make", "-s", "-C", str(STANDIN)], check=True)
    return STANDIN / "build"


def served(*calls: CallEvent, min_call_ns: int = 0, metrics=None):
    """A request on thread 101 of process 100 from t=10 to t=50, with ``calls`` in between (or
    around); ``metrics``: a SpanMetrics the consumer feeds too."""
    pipeline, out, counters = make_pipeline()
    if metrics is not None:
        pipeline.wrap_consumer(lambda consumer: Metered(consumer, metrics))
    gpu.attach(pipeline, min_call_ns)
    events = [ProcessStart(1, 100, "server"), accepted(1, 100), data(10, 1, 100, IN, GET, tid=101)]
    events += [c for c in calls if c.ts_ns < 50]
    events.append(data(50, 1, 100, OUT, OK, tid=101))
    events += [c for c in calls if c.ts_ns >= 50]
    pipeline.handle(events)
    pipeline.finish()
    server = next(s for s in out.spans if s.scope == "otelbpf.http1")
    return server, [s for s in out.spans if s is not server], counters


def call(ts, end, function, args=(), library="cuda", ret=0, launches=0, first_launch=0, out0=0, tid=101, launch_ns=0):
    return CallEvent(ts, end, 100, tid, library, function, args, ret, 0, launches, first_launch, out0, launch_ns)


def test_launches_counted_after_the_request_started_land_on_it():
    server, children, counters = served(
        call(20, 22, "cudaDeviceSynchronize", launches=5, first_launch=15),
        call(30, 31, "cudaMemcpy", (1, 2, 64, 2), launches=2, first_launch=25),
    )
    assert server.attributes["otelbpf.gpu.kernel_launches"] == 7
    assert all(c.parent_span_id == server.span_id for c in children)


def test_launches_that_began_before_the_request_are_not_guessed_onto_it():
    server, _children, counters = served(call(20, 22, "cudaDeviceSynchronize", launches=4, first_launch=5))
    assert server.attributes["otelbpf.gpu.kernel_launches"] == 0
    assert counters.get("otelbpf.gpu.launches.unattributed") == 4


def test_launches_outside_any_request_go_to_the_engine_step_not_the_request():
    server, children, counters = served(call(60, 61, "cuStreamSynchronize", (0,), launches=3, first_launch=55))
    assert "otelbpf.gpu.kernel_launches" not in server.attributes
    [step] = [c for c in children if c.name == "gpu step"]
    [sync] = [c for c in children if c.name == "cuStreamSynchronize"]
    assert sync.parent_span_id == step.span_id and step.parent_span_id == b"" and step.links == []
    assert step.attributes["otelbpf.gpu.kernel_launches"] == 3 and step.start_ns == 55
    assert counters.get("otelbpf.gpu.launches.outside_requests") == 0


def test_pinned_memory_makes_copies_non_pageable_and_frees_report_sizes():
    _server, spans, _ = served(
        call(11, 12, "cudaHostAlloc", (0x7000, 4096, 0), out0=0x10000),
        call(13, 14, "cudaMalloc", (0x7008, 1000), out0=0xD000),
        call(15, 16, "cudaMemcpyAsync", (0xD000, 0x10800, 100, 1, 0)),  # inside the pinned range
        call(17, 18, "cuMemcpyHtoD_v2", (0xD000, 0x20000, 100)),  # outside: pageable
        call(19, 20, "cudaFree", (0xD000,)),
        call(21, 22, "cudaFree", (0xBAD,), ret=1),  # cudaErrorInvalidValue
    )
    pinned_copy, pageable_copy, free, bad_free = spans[2:]
    assert pinned_copy.attributes["otelbpf.gpu.memcpy.pageable"] is False
    assert pageable_copy.attributes["otelbpf.gpu.memcpy.pageable"] is True
    assert pageable_copy.attributes["otelbpf.gpu.memcpy.kind"] == "host_to_device"
    assert free.attributes["otelbpf.gpu.memory.bytes"] == 1000
    assert bad_free.status_code == StatusCode.ERROR and bad_free.attributes["otelbpf.gpu.error_code"] == 1


def test_nccl_arguments_by_register():
    _server, (init, allgather, send, failed), _ = served(
        call(11, 12, "ncclCommInitRank", (0x7000, 8, 6, 0, 0, 0), library="nccl", out0=0xC0FFEE),
        call(13, 14, "ncclAllGather", (1, 2, 10, 9, 0xC0FFEE, 0), library="nccl"),
        call(15, 16, "ncclSend", (1, 300, 0, 7, 0xC0FFEE, 0), library="nccl"),
        call(17, 18, "ncclAllReduce", (1, 2, 3, 99, 0, 0xC0FFEE), library="nccl", ret=4),
    )
    assert (init.attributes["otelbpf.nccl.rank"], init.attributes["otelbpf.nccl.nranks"]) == (6, 8)
    assert init.attributes["otelbpf.nccl.communicator"] == "c0ffee"
    assert (allgather.attributes["otelbpf.nccl.bytes"], allgather.attributes["otelbpf.nccl.datatype"]) == (20, "bfloat16")
    assert (send.attributes["otelbpf.nccl.peer"], send.attributes["otelbpf.nccl.bytes"]) == (7, 300)
    assert "otelbpf.nccl.bytes" not in failed.attributes  # unknown datatype: no guessed size
    assert failed.status_code == StatusCode.ERROR and failed.attributes["otelbpf.nccl.result"] == 4


def test_versioned_runtime_symbols_and_weak_nccl_aliases_resolve_once_per_address(standin):
    runtime = resolve_symbols(str(standin / "libcudart.so.12"), ["cudaMalloc", "cudaMemcpy"])
    assert sorted(n for s in runtime for n in s.names) == ["cudaMalloc", "cudaMemcpy"]  # cudaMalloc@@libcudart.so.12
    [allreduce] = resolve_symbols(str(standin / "libnccl.so.2"), ["ncclAllReduce", "pncclAllReduce"])
    assert sorted(allreduce.names) == ["ncclAllReduce", "pncclAllReduce"]  # one address: attached once


def test_a_renamed_copy_is_a_candidate_by_its_exports(standin, tmp_path):
    bundled = tmp_path / "libtorch_cuda_rt.so"
    shutil.copy(standin / "libcudart.so.12", bundled)
    spec = next(ProbeSpec(n, lib, f, hint=h) for n, lib, h, f, _fl, _l in gpu_probes.CALL_PROBES if n == "gpu.cudart")
    assert spec.matches(str(bundled)) and not ProbeSpec("x", spec.library, spec.symbols).matches(str(bundled))
    plain = tmp_path / "libplain.so"
    plain.write_bytes(b"\x7fELF nothing here")
    assert not is_candidate(str(plain), str(plain), None, b"cudaMemcpyAsync")


def test_no_probe_on_functions_called_per_launch():
    probed = {f for _n, _lib, _h, functions, _fl, _l in gpu_probes.CALL_PROBES for f in functions}
    assert not probed & {"cudaGetDevice", "cuCtxGetDevice", "cudaLaunchKernel"}
    launches = {f for spec in gpu_probes.LAUNCH_SPECS for f in spec.symbols}
    assert launches >= {"cuLaunchKernel", "cuLaunchKernelEx", "cuGraphLaunch"}
    assert all(spec.ret is None for spec in gpu_probes.LAUNCH_SPECS)  # entry-only
    # the launched handle's place decides the program: first argument, second (Ex), a graph's
    entries = {f: spec.entry for spec in gpu_probes.LAUNCH_SPECS for f in spec.symbols}
    assert entries["cuLaunchKernel"] == "gpu_launch_enter" and entries["cuLaunchKernelEx"] == "gpu_launch_ex_enter"
    assert entries["cuGraphLaunch"] == "gpu_graph_launch_enter"
    # naming the kernels of launch samples: the runtime's launch calls are noted, entry only
    runtime = [spec for spec in gpu_probes.NAME_SPECS if spec.name.startswith("gpu.launches")]
    assert all(spec.ret is None for spec in runtime) and gpu_probes.RUNTIME_LAUNCH_FUNCTIONS >= {"cudaLaunchKernel"}


def test_doctor_says_what_each_process_would_have_probed(standin, services):
    from otelbpf.cli.doctor import check_gpu

    server = services([str(ROOT / "examples" / "gpu_inference_server.py"), "--port", "0"])
    assert check_gpu([server.pid])[0].detail.startswith("no running process")  # loaded on first use
    subprocess.run(["curl", "-sf", f"http://127.0.0.1:{server.port}/infer"], check=True, capture_output=True)
    details = [c.detail for c in check_gpu([server.pid])]
    assert len(details) == 3 and all(d.startswith(f"pid {server.pid} ") for d in details)
    driver = next(d for d in details if "libcuda.so.1" in d)
    assert "kernel launches counted at cuGraphLaunch, cuLaunchCooperativeKernel, cuLaunchKernel, cuLaunchKernelEx" in driver


def straggler_run(late_rank: int, late_ns: int, collectives: int = 30, nranks: int = 4) -> list[str]:
    detector = nccl_lateness.StragglerDetector()
    for rank in range(nranks):
        detector.joined(100 + rank, 0xC0 + rank, "ab" * 16, rank, nranks)
    lines = []
    for n in range(collectives):
        base = n * 1_000_000_000
        for rank in range(nranks):
            # the others enter in a different order every time, a few microseconds apart
            ts = base + ((rank + n) % nranks) * 3_000 + (late_ns if rank == late_rank else 0)
            line = detector.entered(100 + rank, 0xC0 + rank, "AllReduce", ts)
            if line:
                lines.append(line)
    return lines


def test_a_persistently_late_rank_is_named_once():
    [line] = straggler_run(late_rank=2, late_ns=41_000_000)
    assert line == "otelbpf: straggler: rank 2 of communicator abababab… entered last in 10 of 10 all-reduces (median 41 ms late)"


def test_no_rank_is_named_when_none_is_late_or_lateness_is_noise():
    assert straggler_run(late_rank=-1, late_ns=0) == []
    assert straggler_run(late_rank=1, late_ns=200_000) == []  # last every time, but 0.2 ms: noise


def test_collectives_of_unknown_communicators_are_ignored():
    detector = nccl_lateness.StragglerDetector()
    assert detector.entered(1, 0xDEAD, "AllReduce", 5) is None and not detector.open


def test_gpu_call_spans_feed_the_gpu_metrics():
    """Durations per function (errors by code), bytes per copy direction split by pageable
    host memory, NCCL durations and bytes per operation (otelbpf/metrics/gpu.py)."""
    from otelbpf.metrics.histograms import SpanMetrics
    from otelbpf.registry import default_instruments

    server, spans, _ = served(
        call(11, 12, "cudaHostAlloc", (0x7000, 4096, 0), out0=0x10000),
        call(13, 15, "cudaMemcpyAsync", (0xD000, 0x10800, 100, 1, 0)),  # pinned
        call(16, 20, "cudaMemcpy", (0xD000, 0x20000, 300, 1)),  # pageable
        call(21, 22, "cudaMemcpy", (0xD000, 0x20000, 200, 1)),  # pageable
        call(23, 24, "cudaFree", (0xBAD,), ret=1),
        call(25, 30, "ncclAllGather", (1, 2, 10, 9, 0xC0FFEE, 0), library="nccl"),
    )
    metrics = SpanMetrics(_Resources(), default_instruments())
    for span in [server, *spans]:
        metrics.record(span)
    points = {}
    for process in metrics.collect().processes:
        for name in ("otelbpf.gpu.call.duration", "otelbpf.gpu.memcpy.size", "otelbpf.nccl.call.duration", "otelbpf.nccl.call.size"):
            for point in process.points(name):
                points.setdefault(name, []).append(point)

    def by(name, key):
        return {tuple(dict(p.attributes).get(k) for k in key): p for p in points[name]}

    copies = by("otelbpf.gpu.memcpy.size", ("otelbpf.gpu.memcpy.kind", "otelbpf.gpu.memcpy.pageable"))
    assert (copies[("host_to_device", True)].count, copies[("host_to_device", True)].sum) == (2, 500)
    assert (copies[("host_to_device", False)].count, copies[("host_to_device", False)].sum) == (1, 100)
    durations = by("otelbpf.gpu.call.duration", ("code.function.name", "error.type"))
    assert durations[("cudaMemcpy", None)].count == 2
    assert durations[("cudaFree", "1")].count == 1
    nccl = by("otelbpf.nccl.call.size", ("otelbpf.nccl.operation",))
    assert len(nccl) == 1 and next(iter(nccl.values())).sum == 20
    assert len(points["otelbpf.nccl.call.duration"]) == 1


class _Resources:
    def attributes(self, pid):
        return {"service.name": "gpu-server"}


# -- launch time, folded calls, the collective hold, arm64 ---------------------------------------


def test_time_inside_launch_calls_lands_on_the_request_span_with_the_count():
    server, _children, _ = served(
        call(20, 22, "cudaDeviceSynchronize", launches=5, first_launch=15, launch_ns=900),
        call(30, 31, "cudaMemcpy", (1, 2, 64, 2), launches=2, first_launch=25, launch_ns=300),
    )
    assert server.attributes["otelbpf.gpu.kernel_launches"] == 7
    assert server.attributes["otelbpf.gpu.kernel_launch.duration"] == 1200


def test_short_successful_cuda_calls_are_folded_per_function_and_still_measured():
    from otelbpf.metrics.histograms import SpanMetrics
    from otelbpf.registry import default_instruments

    metrics = SpanMetrics(_Resources(), default_instruments())
    server, children, counters = served(
        call(11, 13, "cudaMalloc", (0x7008, 64), out0=0xD000),
        call(14, 15, "cudaFree", (0xD000,)),
        call(16, 19, "cudaMalloc", (0x7008, 64), out0=0xD100),
        call(20, 21, "cudaFree", (0xBAD,), ret=1),  # failed: always a span
        call(22, 40, "cudaDeviceSynchronize"),  # 18 ns: over the threshold
        call(41, 42, "ncclAllReduce", (1, 2, 3, 7, 0, 0xC0FFEE), library="nccl"),  # NCCL: never folded
        call(60, 61, "cudaFree", (0xD100,)),  # after the request: folded into an engine step
        min_call_ns=10, metrics=metrics,
    )  # fmt: skip
    [step] = [c for c in children if c.name == "gpu step"]
    assert step.attributes["otelbpf.gpu.folded_calls.function"] == ["cudaFree"]
    assert step.attributes["otelbpf.gpu.folded_calls.count"] == [1]
    children = [c for c in children if c is not step]
    assert [c.name for c in children] == ["cudaFree", "cudaDeviceSynchronize", "ncclAllReduce"]
    assert server.attributes["otelbpf.gpu.folded_calls.function"] == ["cudaFree", "cudaMalloc"]
    assert server.attributes["otelbpf.gpu.folded_calls.count"] == [1, 2]
    assert server.attributes["otelbpf.gpu.folded_calls.duration"] == [1, 5]
    assert counters.get("otelbpf.gpu.calls.folded") == 4
    [process] = metrics.collect().processes
    counts = {}
    for point in process.points("otelbpf.gpu.call.duration"):
        key = (dict(point.attributes)["code.function.name"], dict(point.attributes).get("error.type"))
        counts[key] = point.count
    # the folded ones included
    assert counts == {("cudaMalloc", None): 2, ("cudaFree", None): 2, ("cudaFree", "1"): 1, ("cudaDeviceSynchronize", None): 1}


def test_durations_parse_with_units_and_bare_microseconds():
    assert [parse_duration_ns(t) for t in ("50us", "1ms", "0", "2.5ms", "250ns", "1s", "7")] == [
        50_000, 1_000_000, 0, 2_500_000, 250, 1_000_000_000, 7_000,
    ]
    for bad in ("", "fast", "-1ms", "5 parsecs"):
        with pytest.raises(ValueError):
            parse_duration_ns(bad)


def entry(rank, seq=1, ts=0, nranks=3):
    from otelbpf.semantics.nccl_lateness import Entry

    return Entry("ab" * 16, seq, rank, nranks, ts)


def nccl_span(n):
    from otelbpf.core.model import SpanKind, SpanRecord

    return SpanRecord(bytes(16), n.to_bytes(8, "big"), "ncclAllReduce", SpanKind.INTERNAL, 0, 1, 100)


def test_the_hold_marks_a_collective_once_every_rank_is_in():
    from otelbpf.core.selfmetrics import Counters
    from otelbpf.semantics.nccl_lateness import CollectiveHold

    hold = CollectiveHold(Counters())
    spans = [nccl_span(i) for i in range(3)]
    assert hold.add(spans[0], entry(0, ts=1_000)) == []
    assert hold.add(spans[2], entry(2, ts=9_000)) == []  # the rank that entered last arrives before rank 1
    out = hold.add(spans[1], entry(1, ts=1_500))
    assert sorted(s.span_id for s in out) == sorted(s.span_id for s in spans) and hold.held == 0
    assert [s.attributes["otelbpf.nccl.lateness"] for s in spans] == [0, 500, 8_000]
    assert [s.attributes["otelbpf.nccl.last_to_enter"] for s in spans] == [False, False, True]


def test_the_hold_lets_incomplete_collectives_go_unmarked_and_counted():
    from otelbpf.core.selfmetrics import Counters
    from otelbpf.semantics.nccl_lateness import CollectiveHold

    counters = Counters()
    hold = CollectiveHold(counters, timeout_ns=100, max_spans=2)
    a, b, c, d = (nccl_span(i) for i in range(4))  # each ends at 1 on the events' clock
    assert hold.add(a, entry(0, seq=1)) == [] and hold.add(b, entry(0, seq=2)) == []
    assert hold.add(c, entry(0, seq=3)) == [a]  # over the size cap: the oldest collective leaves
    assert hold.add(d, entry(0, seq=3)) == [d]  # the same rank twice in one collective: not guessed
    assert hold.expire(now_ns=100) == [] and hold.expire(now_ns=50) == []  # not yet; the clock never goes back
    assert hold.expire(now_ns=101) == [b, c] and hold.held == 0  # past the timeout
    assert counters.get("otelbpf.nccl.spans.unmatched") == 4
    assert all("otelbpf.nccl.last_to_enter" not in s.attributes for s in (a, b, c, d))


def test_an_agent_stalled_between_the_ranks_spans_still_matches_the_collective():
    """The hold's timeout runs on the events' clock: ranks whose calls returned a millisecond
    apart are matched however long the agent took between handling them (here: a wall-clock
    pause would have been seconds); only events' time past the timeout lets them go."""
    from otelbpf.core.model import SpanKind, SpanRecord
    from otelbpf.core.selfmetrics import Counters
    from otelbpf.semantics.nccl_lateness import CollectiveHold

    def ending(n, end_ns):
        return SpanRecord(bytes(16), n.to_bytes(8, "big"), "ncclAllReduce", SpanKind.INTERNAL, end_ns - 5, end_ns, 1)

    counters = Counters()
    hold = CollectiveHold(counters, timeout_ns=nccl_lateness.HOLD_TIMEOUT_NS)
    base = 10**12
    assert hold.add(ending(0, base), entry(0, ts=base - 5)) == []
    time.sleep(0.01)  # the agent's own pauses do not count
    assert hold.expire(now_ns=base + 1_000_000) == []
    assert len(hold.add(ending(1, base + 1_000), entry(1, ts=base - 4))) == 0
    out = hold.add(ending(2, base + 2_000), entry(2, ts=base - 3))
    assert len(out) == 3 and counters.get("otelbpf.nccl.spans.unmatched", 0) == 0
    assert hold.add(ending(3, base + 3_000), entry(0, seq=2)) == []
    # held since the clock's latest reading (base + 1 ms), let go once the events' clock is past the timeout
    assert hold.expire(now_ns=base + 1_000_000 + nccl_lateness.HOLD_TIMEOUT_NS - 1) == []
    assert len(hold.expire(now_ns=base + 1_000_000 + nccl_lateness.HOLD_TIMEOUT_NS)) == 1
    assert counters.get("otelbpf.nccl.spans.unmatched") == 1


def test_collective_spans_of_a_communicator_with_a_rank_elsewhere_stop_being_held():
    """Rank 0 of 2, rank 1 never seen (on another node): its first collective is held in case
    rank 1 joins late, and leaves unmarked (counted) at the end; one past the hold's timeout
    after the set-up passes at once."""
    late = 11 + nccl_lateness.HOLD_TIMEOUT_NS + 1
    server, children, counters = served(
        call(11, 12, "ncclCommInitRank", (0x7000, 2, 0, 0, 0x1111, 0x2222), library="nccl", out0=0xC0),
        call(13, 14, "ncclAllReduce", (1, 2, 3, 7, 0, 0xC0), library="nccl"),
        call(late, late + 1, "ncclAllReduce", (1, 2, 3, 7, 0, 0xC0), library="nccl"),
    )
    # the late one, after the request, is in an engine step; the held one left last
    init, late_allreduce, first_allreduce = [c for c in children if c.name != "gpu step"]
    assert first_allreduce.start_ns == 13 and late_allreduce.start_ns == late
    for allreduce in (first_allreduce, late_allreduce):
        assert allreduce.attributes["otelbpf.nccl.rank"] == 0
        assert allreduce.attributes["otelbpf.nccl.unique_id"] == init.attributes["otelbpf.nccl.unique_id"]
        assert "otelbpf.nccl.last_to_enter" not in allreduce.attributes
    assert counters.get("otelbpf.nccl.spans.unmatched") == 1


def test_a_rank_destroying_its_handle_first_does_not_release_a_peers_last_collective():
    """Two ranks (two processes) joined long ago (past the hold's timeout); rank 0's
    ncclCommDestroy is handled before rank 1's last collective (events of different
    processes are in time order only within the reordering window): rank 1's span is still
    held and matched with rank 0's, none unmatched. Once both left, the communicator is
    forgotten."""
    from otelbpf.core.selfmetrics import Counters

    late = nccl_lateness.HOLD_TIMEOUT_NS * 3
    detector = nccl_lateness.StragglerDetector(Counters())
    detector.joined(1, 0xA0, "ab" * 16, 0, 2, ts_ns=10)
    detector.joined(2, 0xB0, "ab" * 16, 1, 2, ts_ns=11)
    first = detector.enter(1, 0xA0, "AllReduce", late)
    detector.left(1, 0xA0)
    second = detector.enter(2, 0xB0, "AllReduce", late + 5)
    assert (first.seq, second.seq, second.rank) == (1, 1, 1)
    assert detector.may_all_be_here(second)
    detector.left(2, 0xB0)
    assert detector.joined_ranks == {} and detector.first_joined_ns == {} and detector.live_members == {}


def test_ncclcomminitrank_arguments_on_x86_64_and_arm64():
    """x86-64 (System V): the 128-byte ncclUniqueId is copied onto the stack, so nranks, rank are
    esi, edx and the probe reads the id from the stack into args[4..5]. arm64 (AAPCS64): it goes by
    reference to a caller's copy: x2 holds the pointer, x3 the rank, and the probe reads the
    id's first 16 bytes through x2 into args[4..5]."""
    id_words = (int.from_bytes(bytes(range(8)), "little"), int.from_bytes(bytes(range(8, 16)), "little"))
    x86 = (0x7FF0, 4, 3, 0xC0F, *id_words)  # rdi comm*, esi nranks, edx rank, rcx (config), stack id
    arm = (0x7FF0, 4, 0x7FFE_1000, 3, *id_words)  # x0 comm*, x1 nranks, x2 &id, x3 rank
    expected = (4, 3, bytes(range(16)).hex())
    assert gpu_functions.decode_comm_init(x86, "x86_64") == expected
    assert gpu_functions.decode_comm_init(arm, "aarch64") == expected
    assert gpu_functions.decode_comm_init(arm, "x86_64")[1] != 3  # the other machine's layout reads garbage
    assert gpu_probes.nccl_id_flag("x86_64") == gpu_probes.CALL_READS_STACK_ARG
    assert gpu_probes.nccl_id_flag("aarch64") == gpu_probes.CALL_READS_ARG2_POINTEE
    assert gpu_probes.nccl_id_flag("riscv64") == 0 and gpu_functions.decode_comm_init(x86, "riscv64")[2] == ""


def test_the_arm64_id_flag_matches_the_bpf_source():
    """The flag values user space sets are the ones bpf/calls.c tests, and the arm64 path reads
    the id through the third argument (its first 16 bytes into args[4..5])."""
    source = (ROOT / "bpf" / "calls.c").read_text()
    for name in ("CALL_READS_STACK_ARG", "CALL_READS_ARG2_POINTEE", "CALL_RANK_CLOCK", "CALL_CLOCKED", "CALL_COMM_SEQ",
                 "CALL_COMM_RESET"):
        assert f"#define {name} {getattr(gpu_probes, name)}\n" in source
    assert "unique_id = (void *)frame.args[2];" in source
    assert "__builtin_memcpy(&frame.args[4], whole.bytes, 2 * sizeof(__u64));" in source


def test_collectives_count_their_handle_where_their_arguments_put_it():
    """bpf/calls.c reads the handle from the argument CALL_COMM_ARG names and counts it under
    NCCL's function index: both from the function catalogue; ncclReduce keeps its handle on
    the stack and is not counted."""
    for name, (_count, _type, _op, _other, comm_index) in gpu_functions.NCCL_COLLECTIVES.items():
        flags = gpu_probes.FUNCTION_FLAGS[name]
        if comm_index is None:
            assert flags == 0, name
            continue
        assert flags & gpu_probes.CALL_COMM_SEQ and (flags >> 16) & 7 == comm_index, name
        assert (flags >> 20) & 7 == gpu_functions.NCCL_FUNCTION_INDEX[name], name
    for name in gpu_functions.NCCL_COMM_INITS + ("ncclCommDestroy",):
        assert gpu_probes.FUNCTION_FLAGS[name] == gpu_probes.CALL_COMM_RESET


class _Totals(dict):
    """A stand-in for BCC's gpu_launch_totals table: pid keys (``.value``), leaves with count/time_ns."""

    class Key(int):
        @property
        def value(self):
            return int(self)

    def items(self):
        return [(self.Key(k), v) for k, v in super().items()]


class _Leaf:
    def __init__(self, count, time_ns=0):
        self.count, self.time_ns = count, time_ns


class _Source:
    def __init__(self, table):
        self._bpf = {"gpu_launch_totals": table}
        self.config = None
        self.probes = []

    def add_call_probe(self, *args, **kwargs):
        self.probes.append(args[0])

    def add_probe(self, spec):
        self.probes.append(spec)


def test_launch_totals_of_an_exited_process_are_read_once_more_then_forgotten():
    table = _Totals({7: _Leaf(5), 8: _Leaf(9, 1_500)})
    source = _Source(table)
    source.gpu = gpu_probes.GpuProbes(source, timed_launches=True)
    assert tuple(source.probes[-3:]) == gpu_probes.TIMED_LAUNCH_SPECS
    assert all(spec.ret == "gpu_launch_return" and spec.entry.endswith("_timed") for spec in gpu_probes.TIMED_LAUNCH_SPECS)
    source.gpu.forget(8)  # exited: its BPF entry is freed, its final totals kept for the next read
    assert 8 not in table
    sums = gpu_probes.launch_sums(source)
    assert {pid: [v for _n, _d, _u, v in values] for pid, values in sums.items()} == {7: [5, 0.0], 8: [9, 1.5e-6]}
    assert [name for name, *_ in sums[7]] == ["otelbpf.gpu.kernel.launches", "otelbpf.gpu.kernel.launch.time"]
    assert set(gpu_probes.launch_sums(source)) == {7}  # read once
    source.gpu.forget(99)  # never launched: nothing to keep
    assert gpu_probes.launch_sums(_Source(table)) == {}  # no probes started: nothing


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 3), st.integers(0, 10**6), st.integers(0, 3)), max_size=60))
def test_every_held_span_leaves_exactly_once_whatever_the_entries(entries):
    """Arbitrary (seq, rank, entry time, clock step) sequences: nothing raises, every span added
    leaves once (marked or counted unmatched), and exactly one rank is last in a marked collective."""
    from otelbpf.core.selfmetrics import Counters
    from otelbpf.semantics.nccl_lateness import CollectiveHold

    now = [0]
    counters = Counters()
    hold = CollectiveHold(counters, timeout_ns=5, max_spans=7)
    added, out = [], []
    for n, (seq, rank, ts, step) in enumerate(entries):
        now[0] += step
        span = nccl_span(n)
        added.append(span.span_id)
        out += hold.add(span, entry(rank, seq=seq, ts=ts, nranks=3), now_ns=now[0])
        out += hold.expire(now_ns=now[0])
    out += hold.expire(everything=True)
    assert sorted(s.span_id for s in out) == sorted(added) and hold.held == 0
    marked = [s for s in out if "otelbpf.nccl.last_to_enter" in s.attributes]
    assert len(marked) + counters.get("otelbpf.nccl.spans.unmatched") == len(added)
    assert sum(s.attributes["otelbpf.nccl.last_to_enter"] for s in marked) * 3 == len(marked)
