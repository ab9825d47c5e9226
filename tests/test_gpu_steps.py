"""GPU engine steps and asyncio-task launch counts, without the kernel: events through a real pipeline.

Requests are HTTP/1 exchanges on connections of process 100 (one thread
each); the engine is thread 200 (or process 300) calling CUDA while serving
none (otelbpf/semantics/gpu_steps.py).
"""

from __future__ import annotations

from test_pipeline import IN, OUT, accepted, data, make_pipeline

from otelbpf.core.events import CallEvent, DataEvent, ProcessStart
from otelbpf.semantics import gpu
from otelbpf.semantics.gpu_steps import StepOptions

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
MS = 1_000_000


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


def request(conn: int, path: str, start: int, end: int, pid: int = 100, task: int = 0) -> list:
    """Events of one request on its own connection and thread (tid = 1000 + conn)."""
    tid = 1000 + conn
    return [
        accepted(conn, pid, fd=conn + 10, peer_port=40000 + conn),
        DataEvent(start, pid, tid, conn + 10, conn, IN, len(get(path)), get(path), task_id=task),
        DataEvent(end, pid, tid, conn + 10, conn, OUT, len(OK), OK, task_id=task),
    ]


def call(ts, end, function, args=(0, 0, 0, 0), launches=0, first_launch=0, pid=100, tid=200, task=0):
    return CallEvent(ts, end, pid, tid, "cuda", function, args, 0, task, launches, first_launch, 0)


def run(events, options=None, parents=None):
    pipeline, out, counters = make_pipeline()
    state = gpu.attach(pipeline)
    if options is not None:
        state.steps.options = options
    state.steps.parent_of = (parents or {}).get
    pipeline.handle([ProcessStart(1, 100, "server")] + sorted(events, key=lambda e: e.ts_ns))
    pipeline.finish()
    return out.spans, counters


def split(spans):
    servers = {s.attributes["url.path"]: s for s in spans if s.scope == "otelbpf.http1"}
    steps = sorted((s for s in spans if s.name == "gpu step"), key=lambda s: s.start_ns)
    calls = [s for s in spans if s.scope == "otelbpf.cuda"]
    return servers, steps, calls


def linked(step) -> set[bytes]:
    return {link.span_id for link in step.links}


def test_a_batch_step_links_every_request_in_flight_and_parents_its_calls():
    events = request(1, "/a", 10 * MS, 100 * MS) + request(2, "/b", 12 * MS, 100 * MS)
    events += [
        call(20 * MS, 21 * MS, "cudaMemcpy", (1, 2, 64, 1)),
        call(30 * MS, 60 * MS, "cudaStreamSynchronize", launches=5, first_launch=22 * MS),
    ]
    spans, counters = run(events)
    servers, [step], calls = split(spans)
    assert linked(step) == {servers["/a"].span_id, servers["/b"].span_id}
    assert {link.trace_id for link in step.links} == {servers["/a"].trace_id, servers["/b"].trace_id}
    assert step.parent_span_id == b"" and step.trace_id not in {s.trace_id for s in servers.values()}  # no request's child
    assert all(c.parent_span_id == step.span_id and c.trace_id == step.trace_id for c in calls) and len(calls) == 2
    assert all(c.attributes["otelbpf.association"] == "gpu_step" for c in calls)
    assert (step.start_ns, step.end_ns) == (20 * MS, 60 * MS)
    attrs = step.attributes
    assert (attrs["otelbpf.gpu.step.calls"], attrs["otelbpf.gpu.step.end_reason"], attrs["thread.id"]) == (2, "synchronize", 200)
    assert attrs["otelbpf.gpu.kernel_launches"] == 5 and attrs["otelbpf.gpu.step.requests"] == 2
    assert all("otelbpf.gpu.kernel_launches" not in s.attributes for s in servers.values())
    assert counters.get("otelbpf.association.ambiguous") == 0


def test_only_requests_overlapping_the_step_are_linked():
    events = request(1, "/before", 1 * MS, 5 * MS) + request(2, "/inside", 25 * MS, 28 * MS)
    events += request(3, "/after", 70 * MS, 80 * MS) + request(4, "/across", 15 * MS, 90 * MS)
    events += [call(20 * MS, 21 * MS, "cudaMemcpy", (1, 2, 64, 1)), call(30 * MS, 60 * MS, "cudaDeviceSynchronize")]
    spans, _ = run(events)
    servers, [step], _calls = split(spans)
    assert linked(step) == {servers["/inside"].span_id, servers["/across"].span_id}


def test_a_synchronisation_ends_a_step_and_an_idle_gap_ends_one_too():
    events = request(1, "/a", 1 * MS, 500 * MS) + request(2, "/b", 2 * MS, 500 * MS)
    events += [
        call(10 * MS, 11 * MS, "cudaMemcpy", (1, 2, 64, 1)),
        call(12 * MS, 20 * MS, "cudaStreamSynchronize"),  # step 1 ends here
        call(21 * MS, 22 * MS, "cudaMemcpy", (1, 2, 64, 1)),  # step 2 begins
        call(100 * MS, 101 * MS, "cudaMemcpy", (1, 2, 64, 1)),  # 78 ms later: step 3
        call(102 * MS, 103 * MS, "cudaMalloc", (0, 64)),
    ]
    spans, _ = run(events, StepOptions(gap_ns=50 * MS))
    _servers, steps, calls = split(spans)
    assert [(s.attributes["otelbpf.gpu.step.calls"], s.attributes["otelbpf.gpu.step.end_reason"]) for s in steps] == [
        (2, "synchronize"), (1, "idle"), (2, "idle"),  # the clock passed the gap at the responses
    ]
    assert [(s.start_ns, s.end_ns) for s in steps] == [(10 * MS, 20 * MS), (21 * MS, 22 * MS), (100 * MS, 103 * MS)]
    for step in steps:
        assert len(step.links) == 2
    parents = [c.parent_span_id for c in sorted(calls, key=lambda c: c.start_ns)]
    assert parents == [steps[0].span_id] * 2 + [steps[1].span_id] + [steps[2].span_id] * 2


def test_launches_long_before_a_call_do_not_stretch_the_step_and_max_duration_cuts():
    events = request(1, "/a", 1 * MS, 900 * MS) + request(2, "/b", 2 * MS, 900 * MS)
    events += [
        call(10 * MS, 20 * MS, "cudaMemcpy", (1, 2, 64, 1), launches=3, first_launch=5 * MS),  # launches 5 ms earlier
        call(300 * MS, 301 * MS, "cudaMemcpy", (1, 2, 64, 1)),
    ]
    spans, _ = run(events, StepOptions(gap_ns=1000 * MS, max_duration_ns=100 * MS))
    _servers, steps, _calls = split(spans)
    assert steps[0].start_ns == 5 * MS and steps[0].attributes["otelbpf.gpu.kernel_launches"] == 3
    assert steps[0].attributes["otelbpf.gpu.step.end_reason"] == "max_duration"
    assert len(steps) == 2


def test_links_beyond_the_limit_are_counted_not_kept():
    events = []
    for conn in range(1, 6):
        events += request(conn, f"/r{conn}", conn * MS, 100 * MS)
    events.append(call(20 * MS, 30 * MS, "cudaDeviceSynchronize"))
    spans, counters = run(events, StepOptions(max_links=3))
    servers, [step], _calls = split(spans)
    assert linked(step) == {servers[f"/r{i}"].span_id for i in (1, 2, 3)}  # the earliest requests first
    assert step.attributes["otelbpf.gpu.step.links_dropped"] == 2 and step.attributes["otelbpf.gpu.step.requests"] == 5
    assert counters.get("otelbpf.gpu.step.links_dropped") == 2


def test_an_engine_process_links_the_requests_of_the_process_that_started_it_and_no_other():
    events = request(1, "/api", 10 * MS, 100 * MS, pid=100) + request(2, "/other", 11 * MS, 100 * MS, pid=400)
    events += [call(20 * MS, 40 * MS, "cuStreamSynchronize", pid=300, tid=300)]
    parents = {300: 100, 100: 50, 400: 50}  # 400 is a sibling of the API server, not of the engine
    spans, _ = run(events, parents=parents)
    servers, [step], _calls = split(spans)
    assert linked(step) == {servers["/api"].span_id}
    spans, _ = run(events, StepOptions(scope="process"), parents=parents)
    _servers, [step], _calls = split(spans)
    assert step.links == []


def test_a_thread_serving_a_request_makes_no_step_and_requests_cost_no_following():
    events = request(1, "/a", 10 * MS, 100 * MS) + request(2, "/b", 11 * MS, 100 * MS)
    events.append(call(20 * MS, 30 * MS, "cudaDeviceSynchronize", tid=1001))  # the thread that read /a
    pipeline, out, _counters = make_pipeline()
    gpu.attach(pipeline)
    pipeline.handle(sorted(events, key=lambda e: e.ts_ns))
    pipeline.finish()
    servers, steps, [sync] = split(out.spans)
    assert steps == [] and sync.parent_span_id == servers["/a"].span_id
    assert pipeline.linker.window_observers == []  # no step yet: requests are not followed


def test_an_asyncio_task_s_launches_land_on_its_own_request():
    """Two requests answered by two tasks of one event-loop thread; their calls
    interleave. Each call is decided when its task answers; its launches follow."""
    loop = 1001  # both requests are read and answered on one thread
    events = [
        accepted(1, 100, fd=11, peer_port=40001), accepted(2, 100, fd=12, peer_port=40002),
        DataEvent(10 * MS, 100, loop, 11, 1, IN, len(get("/a")), get("/a")),
        DataEvent(11 * MS, 100, loop, 12, 2, IN, len(get("/b")), get("/b")),
        call(20 * MS, 21 * MS, "cudaMemcpy", (1, 2, 64, 1), launches=4, first_launch=15 * MS, tid=loop, task=0xA),
        call(22 * MS, 23 * MS, "cudaMemcpy", (1, 2, 64, 1), launches=9, first_launch=16 * MS, tid=loop, task=0xB),
        DataEvent(30 * MS, 100, loop, 12, 2, OUT, len(OK), OK, task_id=0xB),
        DataEvent(31 * MS, 100, loop, 11, 1, OUT, len(OK), OK, task_id=0xA),
    ]
    spans, counters = run(events)
    servers, steps, calls = split(spans)
    assert steps == []
    by_task = {c.start_ns: c for c in calls}
    assert by_task[20 * MS].parent_span_id == servers["/a"].span_id
    assert by_task[22 * MS].parent_span_id == servers["/b"].span_id
    assert servers["/a"].attributes["otelbpf.gpu.kernel_launches"] == 4
    assert servers["/b"].attributes["otelbpf.gpu.kernel_launches"] == 9
    assert counters.get("otelbpf.gpu.launches.outside_requests") == 0


def test_the_steps_of_an_exited_process_end_with_it():
    events = request(1, "/a", 10 * MS, 100 * MS)
    events += [call(20 * MS, 21 * MS, "cudaMemcpy", (1, 2, 64, 1), pid=300, tid=300)]
    pipeline, out, _counters = make_pipeline()
    state = gpu.attach(pipeline)
    state.steps.parent_of = {300: 100}.get
    from otelbpf.core.events import ProcessExit

    pipeline.handle(sorted(events, key=lambda e: e.ts_ns) + [ProcessExit(25 * MS, 300)])
    pipeline.finish()
    [step] = [s for s in out.spans if s.name == "gpu step"]
    assert step.attributes["otelbpf.gpu.step.end_reason"] == "process_exited" and step.end_ns == 21 * MS


# -- robustness --------------------------------------------------------------------------

from hypothesis import (  # noqa: E402
    given,
    settings,
    strategies as st,  # noqa: E402
)

FUNCTIONS = ["cudaMemcpy", "cudaMalloc", "cudaStreamSynchronize", "cuCtxSynchronize", "ncclAllReduce"]
calls_strategy = st.lists(
    st.tuples(
        st.integers(0, 2_000),  # start, ms
        st.integers(0, 50),  # duration, ms
        st.sampled_from(FUNCTIONS),
        st.sampled_from([(100, 200), (100, 201), (300, 300)]),  # (pid, tid): engine threads / an engine process
        st.integers(0, 5),  # launches
    ),
    max_size=40,
)
requests_strategy = st.lists(st.tuples(st.integers(0, 2_000), st.integers(0, 300)), max_size=12)


@settings(max_examples=150, deadline=None)
@given(calls_strategy, requests_strategy, st.integers(1, 4), st.integers(1, 200), st.integers(1, 500))
def test_any_calls_and_requests_give_each_call_one_emitted_step_with_bounded_overlapping_links(
    calls, requests, max_links, gap_ms, max_ms
):
    events = []
    for conn, (start, length) in enumerate(requests, start=1):
        events += request(conn, f"/r{conn}", start * MS + 1, (start + length) * MS + 2)
    for start, length, function, (pid, tid), launches in calls:
        library = "nccl" if function.startswith("nccl") else "cuda"
        events.append(CallEvent(start * MS, (start + length) * MS, pid, tid, library, function, (0,) * 6, 0, 0,
                                launches, max(0, start * MS - 3 * MS) if launches else 0, 0))  # fmt: skip
    spans, counters = run(events, StepOptions(gap_ns=gap_ms * MS, max_duration_ns=max_ms * MS, max_links=max_links),
                          parents={300: 100})  # fmt: skip
    servers = {s.span_id: s for s in spans if s.scope == "otelbpf.http1"}
    steps = {s.span_id: s for s in spans if s.name == "gpu step"}
    gpu_calls = [s for s in spans if s.scope in ("otelbpf.cuda", "otelbpf.nccl")]
    assert len(gpu_calls) == len(calls) and len(steps) == sum(1 for s in spans if s.name == "gpu step")
    for call_span in gpu_calls:
        step = steps[call_span.parent_span_id]  # every call is in a step emitted once (no request reads on 200/201/300)
        assert step.start_ns <= call_span.start_ns and call_span.trace_id == step.trace_id
    for step in steps.values():
        assert step.parent_span_id == b"" and len(step.links) <= max_links
        assert step.attributes["otelbpf.gpu.step.requests"] == len(step.links) + step.attributes.get(
            "otelbpf.gpu.step.links_dropped", 0
        )
        for link in step.links:
            linked = servers[link.span_id]
            assert linked.start_ns <= step.end_ns and linked.end_ns >= step.start_ns  # in flight during the step
    assert sum(s.attributes.get("otelbpf.gpu.kernel_launches", 0) for s in steps.values()) + counters.get(
        "otelbpf.gpu.launches.unattributed"
    ) == sum(c[4] for c in calls)


def test_the_command_line_sets_the_step_options():
    import argparse

    from otelbpf.semantics.gpu_steps import add_arguments, options_from

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert options_from(parser.parse_args([])) == StepOptions()
    args = parser.parse_args(["--gpu-step-gap-ms", "5", "--gpu-step-max-ms", "250", "--gpu-step-max-links", "7",
                              "--gpu-step-scope", "process"])  # fmt: skip
    assert options_from(args) == StepOptions(gap_ns=5 * MS, max_duration_ns=250 * MS, max_links=7, scope="process")


def test_an_idle_agent_still_ends_a_step_when_the_clock_moves_on():
    """No event after the step's last call: the agent's idle tick (Pipeline.tick_idle, once a
    second) ends it by the idle gap, without waiting for the next event or the agent's stop."""
    pipeline, out, _ = make_pipeline()
    gpu.attach(pipeline)
    events = request(1, "/a", 1 * MS, 3 * MS) + [call(2 * MS, 2 * MS + 10, "cudaMemcpy")]
    pipeline.handle([ProcessStart(1, 100, "server")] + sorted(events, key=lambda e: e.ts_ns))
    assert [s.name for s in out.spans if s.name == "gpu step"] == []  # the gap has not passed yet
    pipeline.tick_idle(2 * MS)  # behind the latest event: not taken back
    assert [s.name for s in out.spans if s.name == "gpu step"] == []
    pipeline.tick_idle(500 * MS)
    [step] = [s for s in out.spans if s.name == "gpu step"]
    assert step.attributes["otelbpf.gpu.step.end_reason"] == "idle"
    assert [s.parent_span_id for s in out.spans if s.scope == "otelbpf.cuda"] == [step.span_id]
