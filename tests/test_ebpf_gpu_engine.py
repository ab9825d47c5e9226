"""Real eBPF: a batching engine's GPU steps linked to the requests they served,
and CUDA calls from asyncio tasks under their own requests.

examples/gpu_batching_server.py (FastAPI on uvicorn) hands each /generate
request to a batching engine, a worker thread or a child process, that runs
one GPU step per batch on the stand-in CUDA libraries; its /async_infer
handler calls CUDA itself from its asyncio task, interleaving with other
requests. Concurrent curl clients; spans checked at the OTLP receiver
(tests/otlp_receiver.py, official protobufs), links included.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import ROOT, EXAMPLES, wait_until
from otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.ebpf

STANDIN = ROOT / "examples" / "cuda_standin"
SERVER = 2  # OTLP SpanKind
SYNC_US = 20_000
ROUNDS, BATCH = 4, 3


@pytest.fixture(scope="module", autouse=True)
def standin_libraries():
    subprocess.run(["make", "-s", "-C", str(STANDIN)], check=True)


def get(port: int, path: str) -> subprocess.Popen:
    return subprocess.Popen(["curl", "-sf", f"http://127.0.0.1:{port}{path}"], stdout=subprocess.PIPE, text=True)


def answers(clients: list[subprocess.Popen]) -> list[dict]:
    out = []
    for client in clients:
        stdout, _ = client.communicate(timeout=30)
        assert client.returncode == 0
        out.append(json.loads(stdout))
    return out


def traced(services, agent, receiver, engine: str, *others):
    """The batching server (engine in a thread or a child process) and the agent tracing it, its
    engine and ``others`` (services)."""
    server = services(
        [str(EXAMPLES / "gpu_batching_server.py"), "--port", "0", "--engine", engine, "--batch-size", str(BATCH),
         "--batch-wait-ms", "3000"],
        env={"CUDA_STANDIN_SYNC_US": str(SYNC_US)},
    )  # fmt: skip
    engine_pid = answers([get(server.port, "/engine")])[0]["pid"]
    pids = {server.pid, engine_pid, *(other.pid for other in others)}
    # steps end at their synchronisation; a long idle gap keeps a busy CI from cutting one in two
    # every call a span (--gpu-min-call-duration 0): the stand-in calls are shorter than the default fold
    args = ["--otlp-endpoint", receiver.grpc_endpoint, "--gpu-step-gap-ms", "500", "--gpu-min-call-duration", "0"]
    run = agent([arg for pid in sorted(pids) for arg in ("--pid", str(pid))] + args)
    probing = f"GPU: pid {engine_pid}: probing {STANDIN}/build/libcudart.so.12 "
    assert wait_until(lambda: probing in run.output, timeout=15), run.output
    return server, engine_pid, run


def spans_by_id(spans) -> dict[bytes, object]:
    return {s.span.span_id: s for s in spans}


@pytest.mark.parametrize("engine", ["thread", "process"])
def test_each_engine_step_links_exactly_the_requests_it_batched(services, agent, engine):
    """Another traced service on the host (a sibling of the server) serves a slow request during
    every step: out of the step's scope, it is never linked."""
    other = services([str(EXAMPLES / "http_backend.py"), "--port", "0", "--delay-ms", "400"])
    with OtlpReceiver(http_port=None) as receiver:
        server, engine_pid, run = traced(services, agent, receiver, engine, other)
        batches = []
        for round_ in range(ROUNDS):
            unrelated = get(other.port, f"/items/{round_}")
            clients = [get(server.port, f"/generate/r{round_}-{i}?launches={i + 1 + round_}") for i in range(BATCH)]
            replies = answers(clients)
            answers([unrelated])
            assert {tuple(r["batch"]) for r in replies} == {tuple(sorted(f"r{round_}-{i}" for i in range(BATCH)))}
            batches.append(replies[0]["batch"])
        assert run.stop() == 0
        spans = receiver.spans()

    requests = {s.attributes["url.path"].rsplit("/", 1)[-1]: s for s in spans if s.span.kind == SERVER
                and s.attributes["url.path"].startswith("/generate/")}  # fmt: skip
    assert len(requests) == ROUNDS * BATCH
    steps = [s for s in spans if s.name == "gpu step"]
    assert len(steps) == ROUNDS, [(s.attributes, len(s.span.links)) for s in steps]
    request_traces = {r.span.trace_id for r in requests.values()}
    by_id = spans_by_id(spans)
    seen_batches = []
    for step in steps:
        assert step.scope == "otelbpf.gpu_step" and step.resource["process.pid"] == engine_pid
        assert step.span.parent_span_id == b"" and step.span.trace_id not in request_traces  # no request's child
        # the links, as the receiver decoded them: exactly the requests of one batch
        linked = {link.span_id for link in step.span.links}
        batch = sorted(item for item, request in requests.items() if request.span.span_id in linked)
        assert len(linked) == len(batch) == BATCH, batch
        for link in step.span.links:
            assert link.trace_id == by_id[link.span_id].span.trace_id
        seen_batches.append(batch)
        # its GPU calls are its children
        children = sorted((s for s in spans if s.span.parent_span_id == step.span.span_id),
                          key=lambda s: s.span.start_time_unix_nano)  # fmt: skip
        assert [c.name for c in children] == ["cudaMemcpy", "cudaMemcpyAsync", "cudaStreamSynchronize"]
        assert all(c.span.trace_id == step.span.trace_id and c.attributes["otelbpf.association"] == "gpu_step" for c in children)
        expected_launches = sum(int(item.split("-")[1]) + 1 + int(item[1:].split("-")[0]) for item in batch)
        assert step.attributes["otelbpf.gpu.kernel_launches"] == expected_launches
        assert step.attributes["otelbpf.gpu.step.calls"] == 3
        assert step.attributes["otelbpf.gpu.step.end_reason"] == "synchronize"
        assert step.attributes["otelbpf.gpu.step.requests"] == BATCH
        assert step.span.end_time_unix_nano - step.span.start_time_unix_nano >= SYNC_US * 1000
    assert sorted(seen_batches) == sorted(batches)
    unrelated = [s for s in spans if s.resource["process.pid"] == other.pid and s.span.kind == SERVER]
    assert len(unrelated) == ROUNDS  # traced, and linked by no step (above) though in flight during them:
    for step in steps:
        assert any(
            u.span.start_time_unix_nano <= step.span.end_time_unix_nano and u.span.end_time_unix_nano >= step.span.start_time_unix_nano
            for u in unrelated
        )
    for request in requests.values():  # the requests themselves made no GPU call
        assert "otelbpf.gpu.kernel_launches" not in request.attributes
        assert not [s for s in spans if s.span.parent_span_id == request.span.span_id]


def test_calls_from_interleaved_asyncio_tasks_land_under_their_own_requests(services, agent):
    with OtlpReceiver(http_port=None) as receiver:
        server, _engine_pid, run = traced(services, agent, receiver, "thread")
        answers([get(server.port, "/load")])
        counts = list(range(1, 9))
        replies = answers([get(server.port, f"/async_infer/{n}") for n in counts])
        assert sorted(r["launches"] for r in replies) == counts
        assert run.stop() == 0
        spans = receiver.spans()

    requests = {int(s.attributes["url.path"].rsplit("/", 1)[-1]): s for s in spans if s.span.kind == SERVER
                and s.attributes["url.path"].startswith("/async_infer/")}  # fmt: skip
    assert sorted(requests) == counts
    calls = [s for s in spans if s.scope == "otelbpf.cuda"]
    assert len(calls) == 3 * len(counts)
    starts = sorted((s.span.start_time_unix_nano, s.span.end_time_unix_nano) for s in requests.values())
    assert any(b[0] < a[1] for a, b in zip(starts, starts[1:])), "the requests did not overlap"
    for launches, request in requests.items():
        children = sorted((s for s in calls if s.span.parent_span_id == request.span.span_id),
                          key=lambda s: s.span.start_time_unix_nano)  # fmt: skip
        assert [c.name for c in children] == ["cudaMalloc", "cudaMemcpy", "cudaFree"], launches
        assert all(c.attributes["otelbpf.association"] == "task" and c.span.trace_id == request.span.trace_id for c in children)
        assert request.attributes["otelbpf.gpu.kernel_launches"] == launches  # per task, though the tasks interleaved
    assert not [s for s in spans if s.name == "gpu step"]
