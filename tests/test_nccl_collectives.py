"""Collective instances across nodes, without eBPF (tests/test_ebpf_ranks.py runs them for real):
the derived ids, two agents' pipelines putting their ranks' spans in one trace, spans left
unjoined (and counted) when the set-up was not seen, alignment on NCCL's RAS counts and its
refusals, the time between a rank's collectives split, and the metrics per rank."""

from __future__ import annotations

import os
from collections import defaultdict

import pytest
from test_pipeline import Metered, make_pipeline

from otelbpf.core.events import CallEvent, ProcessStart
from otelbpf.metrics.histograms import SpanMetrics
from otelbpf.metrics.gpu import NCCL_INSTRUMENTS
from otelbpf.semantics import gpu
from otelbpf.semantics.nccl_collectives import (
    NOT_COUNTED,
    NOT_SET_UP,
    REALIGNED,
    UNJOINED,
    CollectiveTraces,
    RankIntervals,
    collective_span_id,
    collective_trace_id,
)
from protocols.nccl.comm_hash import accumulator_hash
from protocols.nccl.ras import RasCommunicator, RasRank, RasReport

MS = 1_000_000
UNIQUE_ID = os.urandom(128)
COMM = accumulator_hash(UNIQUE_ID)
HANDLE = 0x5550_0000
ALLREDUCE_COMM_ARG = 5


def init(ts: int, pid: int, tid: int, rank: int, nranks: int, handle: int = HANDLE) -> CallEvent:
    """ncclCommInitRank(comm*, nranks, id, rank) as the probes report it on x86-64."""
    first16 = UNIQUE_ID[:16]
    args = (0x7000, nranks, rank, 0, int.from_bytes(first16[:8], "little"), int.from_bytes(first16[8:], "little"))
    return CallEvent(ts, ts + MS, pid, tid, "nccl", "ncclCommInitRank", args, 0, out0=handle, payload=UNIQUE_ID)


def allreduce(ts: int, pid: int, tid: int, comm_seq: int, count: int = 1, duration: int = MS, handle: int = HANDLE,
              off_cpu: tuple[int, int] = (-1, -1)) -> CallEvent:  # fmt: skip
    args = (0x1000, 0x1000, count, 7, 0, handle)
    return CallEvent(ts, ts + duration, pid, tid, "nccl", "ncclAllReduce", args, 0, comm_seq=comm_seq,
                     off_cpu_entry_ns=off_cpu[0], off_cpu_return_ns=off_cpu[1])  # fmt: skip


def sync(ts: int, end: int, pid: int, tid: int, off_cpu: tuple[int, int] = (-1, -1)) -> CallEvent:
    return CallEvent(ts, end, pid, tid, "cuda", "cudaStreamSynchronize", (0,), 0,
                     off_cpu_entry_ns=off_cpu[0], off_cpu_return_ns=off_cpu[1])  # fmt: skip


def agent(events, metrics: SpanMetrics | None = None):
    """One node's pipeline over ``events`` (time-ordered); its spans and counters."""
    pipeline, out, counters = make_pipeline()
    if metrics is not None:
        pipeline.wrap_consumer(lambda consumer: Metered(consumer, metrics))
    gpu.attach(pipeline)
    pipeline.handle(sorted(events, key=lambda e: e.ts_ns))
    pipeline.finish()
    return [s for s in out.spans if s.name == "ncclAllReduce"], counters, gpu.state_of(pipeline)


def test_the_ids_are_the_same_for_everyone_and_differ_by_what_names_an_instance():
    assert collective_trace_id(COMM, "AllReduce", 7) == collective_trace_id(COMM, "AllReduce", 7)
    traces = {collective_trace_id(c, f, s) for c in (COMM, COMM ^ 1) for f in ("AllReduce", "Broadcast") for s in (0, 1)}
    assert len(traces) == 8 and all(len(t) == 16 and any(t) for t in traces)
    spans = {collective_span_id(COMM, "AllReduce", 7, rank) for rank in range(64)}
    assert len(spans) == 64 and all(len(s) == 8 and any(s) for s in spans)


def test_two_nodes_put_their_ranks_spans_of_each_instance_in_one_trace():
    """Ranks 0, 1 on node A (pids 10, 11), 2, 3 on node B (pids 20, 21): every all-reduce's four
    spans land in one trace, one span per rank, linked to what issued them (here: nothing, a root
    call has no issuer); the sequence is NCCL's, from the kernel's count."""
    node_a, node_b = [], []
    for rank, (node, pid) in enumerate(((node_a, 10), (node_a, 11), (node_b, 20), (node_b, 21))):
        node += [ProcessStart(1, pid, "rank"), init(2 * MS, pid, pid, rank, 4)]
        node += [allreduce((10 + 5 * n) * MS + rank, pid, pid, n + 1, count=n + 1) for n in range(6)]
    spans = agent(node_a)[0] + agent(node_b)[0]
    by_trace = defaultdict(list)
    for span in spans:
        by_trace[span.trace_id].append(span)
    assert len(by_trace) == 6
    for trace_id, members in by_trace.items():
        assert sorted(s.attributes["otelbpf.nccl.rank"] for s in members) == [0, 1, 2, 3]
        assert len({s.attributes["otelbpf.nccl.count"] for s in members}) == 1  # one instance
        seq = members[0].attributes["otelbpf.nccl.sequence"]
        assert trace_id == collective_trace_id(COMM, "AllReduce", seq)
        for span in members:
            assert span.span_id == collective_span_id(COMM, "AllReduce", seq, span.attributes["otelbpf.nccl.rank"])
            assert span.attributes["otelbpf.nccl.comm_hash"] == f"{COMM:016x}" and span.attributes["otelbpf.nccl.nranks"] == 4
            assert span.parent_span_id == b"" and span.attributes["otelbpf.association"] == "collective"


def test_an_agent_that_missed_the_set_up_leaves_the_spans_unjoined_and_counts_them():
    events = [ProcessStart(1, 30, "rank")] + [allreduce((10 + n) * MS, 30, 30, n + 1) for n in range(3)]
    events.append(allreduce(20 * MS, 30, 30, 0))  # the kernel could not count it
    spans, counters, _state = agent(events)
    assert all("otelbpf.nccl.comm_hash" not in s.attributes and "otelbpf.nccl.sequence" not in s.attributes for s in spans)
    assert [s.attributes["otelbpf.nccl.unjoined"] for s in spans] == [NOT_SET_UP] * 3 + [NOT_COUNTED]
    assert counters.get(UNJOINED, NOT_SET_UP) == 3 and counters.get(UNJOINED, NOT_COUNTED) == 1


def test_a_request_that_issued_a_collective_keeps_a_link_to_it():
    from test_pipeline import IN, OUT, accepted, data

    get = b"GET /step HTTP/1.1\r\nHost: x\r\n\r\n"
    events = [ProcessStart(1, 100, "server"), accepted(1, 100), data(3 * MS, 1, 100, IN, get, tid=101),
              init(4 * MS, 100, 101, 1, 2), allreduce(8 * MS, 100, 101, 1),
              data(12 * MS, 1, 100, OUT, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", tid=101)]  # fmt: skip
    pipeline, out, _counters = make_pipeline()
    gpu.attach(pipeline)
    pipeline.handle(events)
    pipeline.finish()
    [request] = [s for s in out.spans if s.scope == "otelbpf.http1"]
    [collective] = [s for s in out.spans if s.name == "ncclAllReduce"]
    assert collective.trace_id == collective_trace_id(COMM, "AllReduce", 0) != request.trace_id
    [link] = collective.links
    assert (link.trace_id, link.span_id) == (request.trace_id, request.span_id)


# -- NCCL's own count ------------------------------------------------------------------------------


def report(counts_by_comm: dict[int, dict[int, int]], pid_of_rank: dict[tuple[int, int], int], size: int = 2) -> RasReport:
    """A JSON-like RAS report: comm -> rank -> AllReduce count."""
    comms = []
    for comm, counts in counts_by_comm.items():
        ranks = [RasRank(rank, "10.0.0.1", pid_of_rank[(comm, rank)], counts={"AllReduce": count, "Broadcast": 0})
                 for rank, count in counts.items()]  # fmt: skip
        comms.append(RasCommunicator(comm, size=size, ranks=ranks, complete_counts=True))
    return RasReport("json", communicators=comms)


def late_calls(traces: CollectiveTraces, pid: int, first: int, last: int, start_ms: int, handle: int = HANDLE):
    """Calls ``first``..``last`` (the kernel's numbers) every 10 ms from ``start_ms``; their instances."""
    out = []
    for k in range(first, last + 1):
        call = allreduce((start_ms + 10 * (k - first)) * MS, pid, pid, k, handle=handle)
        out.append(traces.instance(call, "AllReduce", handle)[0])
    return out


def test_a_late_agent_aligns_on_two_agreeing_replies_with_calls_between():
    """NCCL had counted 100 all-reduces before the agent's first; two replies gathered while no
    call was in progress agree on the offset, with calls made in between: aligned, later calls
    joined with NCCL's sequence numbers. A reply is applied once the calls after its window were
    handled (the pipeline applies it half a second later); Broadcast, never called, tells nothing."""
    traces = CollectiveTraces()
    pids = {50: 7}  # pid 50 here is pid 7 in its container
    ranks = {(COMM, 0): 7, (COMM, 1): 8}
    assert late_calls(traces, 50, 1, 5, 0) == [None] * 5  # calls at 0..40 ms, kernel numbers 1..5
    assert late_calls(traces, 50, 6, 8, 50) == [None] * 3
    traces.align(report({COMM: {0: 105, 1: 105}}, ranks), (45 * MS, 46 * MS), pids)
    assert late_calls(traces, 50, 9, 11, 80) == [None] * 3  # one reply is not enough
    traces.align(report({COMM: {0: 108, 1: 108}}, ranks), (75 * MS, 76 * MS), pids)
    [instance] = late_calls(traces, 50, 12, 12, 110)
    assert (instance.comm, instance.seq, instance.rank, instance.nranks) == (COMM, 111, 0, 2)  # 12 - 1 + 100


def test_no_alignment_while_a_call_is_in_progress_during_the_gather():
    traces = CollectiveTraces()
    late_calls(traces, 50, 1, 6, 0)  # calls at 0, 10, ... 50 ms, each 1 ms
    for window in ((10 * MS + MS // 2, 12 * MS), (30 * MS + MS // 2, 31 * MS)):  # the calls at 10 and 30 ms were in progress
        traces.align(report({COMM: {0: 52}}, {(COMM, 0): 50}, size=1), window, {50: 50})
    assert late_calls(traces, 50, 7, 7, 60) == [None]


def test_no_alignment_without_the_calls_after_the_window():
    """A call may have been in progress, unseen, during the gather: the count is not certain."""
    traces = CollectiveTraces()
    late_calls(traces, 50, 1, 2, 0)
    for window in ((50 * MS, 51 * MS), (60 * MS, 61 * MS)):
        traces.align(report({COMM: {0: 10}}, {(COMM, 0): 50}, size=1), window, {50: 50})
    assert traces.handles[(50, HANDLE)].comm is None


def test_no_alignment_on_two_replies_when_the_handle_was_idle_between():
    """An idle handle fits any idle communicator: no evidence."""
    traces = CollectiveTraces()
    late_calls(traces, 50, 1, 2, 0)
    late_calls(traces, 50, 3, 3, 100)
    for window in ((50 * MS, 51 * MS), (60 * MS, 61 * MS)):
        traces.align(report({COMM: {0: 10}}, {(COMM, 0): 50}, size=1), window, {50: 50})
    assert late_calls(traces, 50, 4, 4, 110) == [None] and traces.handles[(50, HANDLE)].comm is None


def test_two_communicators_of_one_process_are_told_apart_by_their_progress():
    """The process has communicators X and Y (RAS lists both for its pid) and the agent sees one
    unknown handle: only X progressed as the handle did between the replies."""
    traces = CollectiveTraces()
    other = COMM ^ 0xFF
    ranks = {(COMM, 1): 50, (other, 1): 50}
    late_calls(traces, 50, 1, 4, 0)  # 0..30 ms
    traces.align(report({COMM: {1: 42}, other: {1: 9}}, ranks), (15 * MS, 16 * MS), {50: 50})  # 2 seen before
    late_calls(traces, 50, 5, 6, 40)  # 40, 50 ms
    traces.align(report({COMM: {1: 44}, other: {1: 11}}, ranks), (35 * MS, 36 * MS), {50: 50})  # both moved by 2
    assert late_calls(traces, 50, 7, 7, 60) == [None]  # ambiguous: both fit
    late_calls(traces, 50, 8, 9, 70)  # 70, 80 ms
    traces.align(report({COMM: {1: 47}, other: {1: 11}}, ranks), (65 * MS, 66 * MS), {50: 50})  # only X moved by 3
    [instance] = late_calls(traces, 50, 10, 10, 90)
    assert (instance.comm, instance.seq, instance.rank) == (COMM, 49, 1)  # 10 - 1 + 40


def test_a_seen_set_up_that_nccl_counts_differently_follows_nccls_count():
    """Collectives captured in a CUDA graph are called but not counted by NCCL: two agreeing
    replies move the handle to NCCL's count (every agent does the same), counted and logged."""
    from otelbpf.core.selfmetrics import Counters

    traces = CollectiveTraces(Counters())
    traces.joined(60, HANDLE, UNIQUE_ID, 0, 2, None)
    late_calls(traces, 60, 1, 12, 10)  # kernel numbers 1..12 at 10..120 ms
    ranks = {(COMM, 0): 60, (COMM, 1): 61}
    traces.align(report({COMM: {0: 8, 1: 8}}, ranks), (95 * MS + MS // 2, 96 * MS), {60: 60})  # 9 returned, NCCL says 8
    late_calls(traces, 60, 13, 14, 130)
    traces.align(report({COMM: {0: 10, 1: 10}}, ranks), (115 * MS + MS // 2, 116 * MS), {60: 60})  # 11 returned, 10
    [instance] = late_calls(traces, 60, 15, 15, 150)
    assert instance.seq == 13  # 15 - 1 - 1
    assert traces.counters.get(REALIGNED) == 1


# -- between collectives -----------------------------------------------------------------------------


def test_the_time_between_collectives_is_split_into_gpu_waits_on_and_off_the_cpu():
    """From the previous collective's return (t=11 ms, clock 100 µs) to the next entry (t=31 ms,
    clock 4.1 ms): a 12 ms synchronisation of which 3 ms off the CPU, 1 ms more off the CPU
    outside it: 12 ms GPU wait, 1 ms off-CPU, 7 ms on-CPU."""
    intervals = RankIntervals()
    assert intervals.collective(allreduce(10 * MS, 1, 1, 1, off_cpu=(0, 100_000))) is None  # its first
    intervals.gpu_wait(sync(15 * MS, 27 * MS, 1, 1, off_cpu=(100_000, 3_100_000)))
    interval = intervals.collective(allreduce(31 * MS, 1, 1, 2, off_cpu=(4_100_000, 4_100_000)))
    assert (interval.duration, interval.gpu_wait, interval.off_cpu, interval.on_cpu) == (20 * MS, 12 * MS, MS, 7 * MS)


def test_without_the_off_cpu_clock_the_host_time_is_not_split():
    intervals = RankIntervals()
    intervals.collective(allreduce(10 * MS, 1, 1, 1))
    intervals.gpu_wait(sync(12 * MS, 14 * MS, 1, 1))
    interval = intervals.collective(allreduce(20 * MS, 1, 1, 2))
    assert (interval.duration, interval.gpu_wait, interval.on_cpu, interval.off_cpu) == (9 * MS, 2 * MS, None, None)


def test_the_rank_metrics_per_state(tmp_path):
    """The histograms the slow-rank rule reads: per rank and communicator, the collective's time
    (its wait) and each part of the time before it."""
    from otelbpf.host.resources import ProcessResources

    metrics = SpanMetrics(ProcessResources(describe=lambda pid, comm: {"service.name": "rank"}), {"nccl": NCCL_INSTRUMENTS})
    events = [ProcessStart(1, 10, "rank"), init(MS, 10, 10, 1, 2)]
    clock = 0
    for n in range(4):
        start = (10 + 20 * n) * MS
        events.append(sync(start - 8 * MS, start - 2 * MS, 10, 10, off_cpu=(clock, clock + MS)))
        clock += 2 * MS
        events.append(allreduce(start, 10, 10, n + 1, duration=3 * MS, off_cpu=(clock, clock)))
    agent(events, metrics)
    points = {}
    for process in metrics.collect().processes:
        for instrument, series in process.histograms:
            if instrument.name == "otelbpf.nccl.time":
                for point in series:
                    points[point.attributes["otelbpf.nccl.state"]] = point
    assert set(points) == {"collective", "gpu_wait", "on_cpu", "off_cpu"}
    assert points["collective"].count == 4 and points["collective"].sum == pytest.approx(0.012)
    assert points["gpu_wait"].count == 3 and points["gpu_wait"].sum == pytest.approx(0.018)
    assert points["off_cpu"].sum == pytest.approx(0.003)  # 1 ms of the 2 ms off the CPU was outside the syncs
    assert points["on_cpu"].sum == pytest.approx(3 * 0.017 - 0.018 - 0.003)
    attrs = points["collective"].attributes
    assert (attrs["otelbpf.nccl.comm_hash"], attrs["otelbpf.nccl.rank"], attrs["otelbpf.nccl.nranks"]) == (f"{COMM:016x}", 1, 2)
