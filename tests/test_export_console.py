"""ConsoleSink: one tree per trace, printed once the trace settled."""

from __future__ import annotations

import io
import time
from typing import Any, Mapping

from otelbpf.core.model import ResourceLookup, SpanKind, SpanLink, SpanRecord, StatusCode
from otelbpf.export import ConsoleSink, SpanBatch


class StaticResources(ResourceLookup):
    def __init__(self, by_pid: Mapping[int, Mapping[str, Any]]) -> None:
        self.by_pid = by_pid

    def attributes(self, pid: int) -> Mapping[str, Any]:
        return self.by_pid.get(pid, {})


RESOURCES = StaticResources({1: {"service.name": "gateway"}, 2: {"service.name": "vllm"}})
TRACE = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")
T0 = 1_700_000_000_000_000_000


def span(span_id: int, parent: int | None, start_ms: float, duration_ms: float, **fields: Any) -> SpanRecord:
    defaults: dict[str, Any] = dict(
        trace_id=TRACE,
        span_id=span_id.to_bytes(8, "big"),
        parent_span_id=parent.to_bytes(8, "big") if parent else b"",
        name="GET /chat",
        kind=SpanKind.SERVER,
        start_ns=T0 + int(start_ms * 1e6),
        end_ns=T0 + int((start_ms + duration_ms) * 1e6),
        pid=1,
    )
    defaults.update(fields)
    return SpanRecord(**defaults)


def small_trace() -> list[SpanRecord]:
    """Children finish (and arrive) before their parent, as they do in practice."""
    return [
        span(3, 2, 2.0, 9.8, name="POST /v1/completions", pid=2, status_code=StatusCode.ERROR,
             status_message="upstream reset",
             attributes={"http.response.status_code": 500, "url.path": "/v1/completions"}),
        span(4, 1, 13.0, 0.4, name="GET /cache", kind=SpanKind.CLIENT, attributes={"url.path": "/cache/k1"}),
        span(2, 1, 1.0, 10.1, name="POST /v1/completions", kind=SpanKind.CLIENT,
             attributes={"http.response.status_code": 500}),
        span(1, None, 0.0, 14.0, attributes={"http.response.status_code": 502, "http.route": "/chat"}),
    ]


def test_a_trace_prints_as_a_tree_with_children_under_parents_by_start() -> None:
    out = io.StringIO()
    sink = ConsoleSink(out, settle_s=60)

    assert sink.export(SpanBatch(small_trace(), RESOURCES))
    sink.flush()

    clock = time.strftime("%H:%M:%S", time.localtime(T0 / 1e9))
    assert out.getvalue().splitlines() == [
        f"trace 4bf92f3577b34da6a3ce929d0e0e4736 · {clock}.000 · 4 spans",
        "  gateway  SERVER  GET /chat  14.0 ms  status=502",
        "  ├─ gateway  CLIENT  POST /v1/completions  10.1 ms  status=500",
        "  │  └─ vllm  SERVER  POST /v1/completions  9.8 ms  status=500  ✗ ERROR upstream reset",
        "  └─ gateway  CLIENT  GET /cache  400 µs  path=/cache/k1",
    ]
    sink.shutdown()


def test_a_trace_waits_until_it_settled_then_prints_whole() -> None:
    out = io.StringIO()
    sink = ConsoleSink(out, settle_s=0.3)
    child, *_, root = small_trace()

    sink.export(SpanBatch([child], RESOURCES))
    time.sleep(0.1)
    sink.export(SpanBatch([root], RESOURCES))  # same trace: the wait starts over
    time.sleep(0.1)
    assert out.getvalue() == ""

    deadline = time.monotonic() + 3
    while not out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.02)
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("2 spans")
    assert len(lines) == 3
    sink.shutdown()


def test_spans_whose_parent_is_not_in_the_output_are_shown_at_top_level() -> None:
    out = io.StringIO()
    sink = ConsoleSink(out, settle_s=60)
    orphan = span(9, 8, 5.0, 1.0, name="GET /orphan", pid=2)
    root = span(1, None, 0.0, 2.0)
    other_trace = span(1, None, 3.0, 1.0, trace_id=bytes(16 * [1]), name="GET /other")

    sink.export(SpanBatch([orphan, other_trace, root], RESOURCES))
    sink.shutdown()  # prints what is still held

    lines = out.getvalue().splitlines()
    assert lines[0].startswith("trace 4bf92f35") and lines[0].endswith("2 spans")
    assert lines[1] == "  gateway  SERVER  GET /chat  2.0 ms"
    assert lines[2] == "  vllm  SERVER  GET /orphan  1.0 ms"
    assert lines[3].startswith("trace 01010101") and lines[4] == "  gateway  SERVER  GET /other  1.0 ms"


def test_a_stream_without_unicode_gets_ascii_tree_lines() -> None:
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="ascii")
    sink = ConsoleSink(out, settle_s=60)

    sink.export(SpanBatch(small_trace(), RESOURCES))
    sink.shutdown()

    text = raw.getvalue().decode("ascii")
    assert "  |- gateway  CLIENT  POST /v1/completions" in text
    assert "  |  `- vllm  SERVER" in text and "x ERROR upstream reset" in text
    assert "400 us" in text


def test_a_broken_stream_does_not_raise() -> None:
    out = io.StringIO()
    sink = ConsoleSink(out, settle_s=0)
    out.close()

    assert sink.export(SpanBatch(small_trace(), RESOURCES)) is True
    sink.shutdown()


def test_a_malformed_span_does_not_stop_the_console() -> None:
    out = io.StringIO()
    sink = ConsoleSink(out, settle_s=0.05)
    broken = span(5, None, 0.0, 1.0, trace_id=bytes(16 * [2]))
    broken.start_ns = "yesterday"  # type: ignore[assignment]

    assert sink.export(SpanBatch([broken, *small_trace()], RESOURCES)) is True
    time.sleep(0.3)  # the ticker prints the good trace
    sink.shutdown()

    assert "4 spans" in out.getvalue()


def test_an_llm_call_shows_time_to_first_chunk_and_tokens() -> None:
    from otelbpf.export.console import describe_span

    llm = span(1, None, 0.0, 412.0, name="chat llama-3-8b", kind=SpanKind.CLIENT, attributes={
        "http.response.status_code": 200, "gen_ai.response.time_to_first_chunk": 0.0812,
        "gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": 64, "otelbpf.gen_ai.response.chunks": 64})
    line = describe_span(llm, "agent")
    assert line == "agent  CLIENT  chat llama-3-8b  412.0 ms  status=200  ttft=81.2 ms  tokens=12in/64out  chunks=64"
    embeddings = span(2, None, 0.0, 3.0, name="embeddings bge", attributes={"gen_ai.usage.input_tokens": 4})
    assert describe_span(embeddings, "vllm").endswith("tokens=4in/?out")


def test_gpu_calls_show_launches_copies_and_sizes() -> None:
    from otelbpf.export.console import describe_span

    request = span(1, None, 0.0, 3.3, name="GET /infer", attributes={"http.response.status_code": 200,
                                                                    "otelbpf.gpu.kernel_launches": 8})
    assert describe_span(request, "gpu").endswith("status=200  launches=8")
    copy = span(2, 1, 0.5, 0.7, name="cudaMemcpy", kind=SpanKind.INTERNAL, attributes={
        "otelbpf.gpu.memcpy.kind": "host_to_device", "otelbpf.gpu.memcpy.bytes": 1048576, "otelbpf.gpu.memcpy.pageable": True})
    assert describe_span(copy, "gpu").endswith("host_to_device 1048576 B pageable")
    alloc = span(3, 1, 0.1, 0.04, name="cudaMalloc", kind=SpanKind.INTERNAL, attributes={"otelbpf.gpu.memory.bytes": 4096})
    assert describe_span(alloc, "gpu").endswith("4096 B")
    step = span(4, None, 0.2, 1.5, name="gpu step", kind=SpanKind.INTERNAL, attributes={"otelbpf.gpu.kernel_launches": 9})
    step.links = [SpanLink(bytes(16), bytes([i + 1]) * 8) for i in range(3)]
    assert describe_span(step, "engine").endswith("gpu step  1.5 ms  launches=9  links=3")
