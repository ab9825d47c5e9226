"""Real eBPF, real processes: Anthropic Messages calls (the real ``anthropic`` SDK) and
rerank / score calls (httpx) against the bundled mock (examples/openai_mock_server.py),
traced from the wire on both sides: CLIENT spans in the client's process, SERVER spans in
the mock's, with the GenAI names and attributes equal to what the client received.

TTFT tolerance as in tests/test_ebpf_genai.py: the mock sleeps its first-token delay
after message_start, content_block_start and ping (written at once), so a time taken
from those instead of the first content_block_delta would be ~0."""

from __future__ import annotations

import textwrap

import pytest
from conftest import EXAMPLES
from test_ebpf_genai import CLIENT, SERVER, assert_stream_timing, metric_names, run_openai_client
from test_ebpf_http import spans_in_file

pytestmark = pytest.mark.ebpf

FIRST_TOKEN_DELAY_MS, TOKEN_DELAY_MS = 300, 40
SECRET = "sk-ant-test-SECRET-not-to-be-exported"

CLIENT_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import anthropic, httpx

    port = int(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()
    client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key=SECRET, max_retries=0, timeout=60)
    out = {}

    def received(m):
        u = m.usage
        return {"id": m.id, "model": m.model, "stop": m.stop_reason, "input": u.input_tokens,
                "cache_read": u.cache_read_input_tokens, "cache_write": u.cache_creation_input_tokens,
                "output": u.output_tokens}

    m = client.messages.create(model="claude-haiku-4-5", max_tokens=64, extra_body={"temperature": 0.5},
                               messages=[{"role": "user", "content": "hello mock world"}])
    out["message"] = received(m)
    system = [{"type": "text", "text": "a long cached system prompt", "cache_control": {"type": "ephemeral"}}]
    with client.messages.stream(model="claude-haiku-4-5", max_tokens=6, system=system, extra_body={"mock_output_tokens": 6},
                                messages=[{"role": "user", "content": "stream please"}]) as stream:
        text = "".join(stream.text_stream)
        out["stream"] = dict(received(stream.get_final_message()), text=text)
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
    r = http.post("/v1/rerank", json={"model": "bge-reranker", "query": "what is ebpf",
                                      "documents": ["a kernel vm", "a fruit", "a tracer"], "top_n": 2}).json()
    out["rerank"] = {"id": r["id"], "model": r["model"], "tokens": r["usage"]["total_tokens"], "results": len(r["results"])}
    s = http.post("/v1/score", json={"model": "bge-reranker", "text_1": "what is ebpf",
                                     "text_2": ["a kernel vm", "a fruit"]}).json()
    out["score"] = {"id": s["id"], "model": s["model"], "tokens": s["usage"]["prompt_tokens"], "results": len(s["data"])}
    print(json.dumps(out), flush=True)
    """
).replace("SECRET", repr(SECRET))


def test_anthropic_sdk_and_rerank_score_give_genai_spans_on_both_sides(services, agent, tmp_path):
    server = services(
        [str(EXAMPLES / "openai_mock_server.py"), "--port", "0",
         "--first-token-delay-ms", str(FIRST_TOKEN_DELAY_MS), "--token-delay-ms", str(TOKEN_DELAY_MS)]
    )  # fmt: skip
    out, metrics_out, sent, run, client_pid = run_openai_client(agent, tmp_path, server, CLIENT_SCRIPT)
    spans = [s for s in spans_in_file(out) if "gen_ai.operation.name" in s.attributes]
    assert len(spans) == 8, [(s.name, s.span.kind) for s in spans_in_file(out)]
    by_side = {(s.span.kind, s.attributes["gen_ai.response.id"]): s for s in spans}
    assert {s.resource["process.pid"] for s in spans if s.span.kind == SERVER} == {server.pid}
    assert {s.resource["process.pid"] for s in spans if s.span.kind == CLIENT} == {client_pid}

    for call in ("message", "stream"):
        expected = sent[call]
        client_span, server_span = by_side[(CLIENT, expected["id"])], by_side[(SERVER, expected["id"])]
        assert server_span.span.parent_span_id == client_span.span.span_id
        for s in (client_span, server_span):
            attrs = s.attributes
            assert s.name == "chat claude-haiku-4-5"
            assert attrs["gen_ai.operation.name"] == "chat"
            assert attrs["gen_ai.provider.name"] == "anthropic"
            assert attrs["gen_ai.request.model"] == "claude-haiku-4-5"
            assert attrs["gen_ai.response.model"] == expected["model"]
            assert attrs["gen_ai.response.finish_reasons"] == [expected["stop"]]
            # the conventions' input tokens include the cached ones (Anthropic's do not)
            assert attrs["gen_ai.usage.input_tokens"] == expected["input"] + expected["cache_read"] + expected["cache_write"]
            assert attrs["gen_ai.usage.cache_read.input_tokens"] == expected["cache_read"]
            assert attrs["gen_ai.usage.cache_creation.input_tokens"] == expected["cache_write"]
            assert attrs["gen_ai.usage.output_tokens"] == expected["output"]
            assert attrs["gen_ai.request.stream"] is (call == "stream")
            assert attrs["http.request.method"] == "POST" and attrs["http.response.status_code"] == 200

    message = by_side[(CLIENT, sent["message"]["id"])].attributes
    assert (message["gen_ai.request.max_tokens"], message["gen_ai.request.temperature"]) == (64, 0.5)
    assert sent["message"]["stop"] == "end_turn" and "gen_ai.response.time_to_first_chunk" not in message
    assert sent["stream"]["stop"] == "max_tokens" and sent["stream"]["cache_read"] == 5
    for kind in (CLIENT, SERVER):  # 6 chunks: content_block_deltas only
        assert_stream_timing(by_side[(kind, sent["stream"]["id"])].attributes, kind, 6, FIRST_TOKEN_DELAY_MS, TOKEN_DELAY_MS)

    for call, operation, documents, top_n in (("rerank", "rerank", 3, 2), ("score", "score", 2, None)):
        expected = sent[call]
        client_span, server_span = by_side[(CLIENT, expected["id"])], by_side[(SERVER, expected["id"])]
        assert server_span.span.parent_span_id == client_span.span.span_id
        for s in (client_span, server_span):
            attrs = s.attributes
            assert s.name == f"{operation} bge-reranker"
            assert attrs["gen_ai.operation.name"] == operation
            assert attrs["gen_ai.provider.name"] == "openai_compatible"
            assert attrs["gen_ai.request.model"] == "bge-reranker"
            assert attrs["gen_ai.response.model"] == expected["model"]
            assert attrs["gen_ai.usage.input_tokens"] == expected["tokens"]
            assert "gen_ai.usage.output_tokens" not in attrs
            assert attrs["otelbpf.gen_ai.request.documents"] == documents
            assert attrs.get("otelbpf.gen_ai.request.top_n") == top_n
            assert attrs["otelbpf.gen_ai.response.results"] == expected["results"]

    for s in spans_in_file(out):  # never the API key (x-api-key is never read)
        assert not any(SECRET in str(value) for value in s.attributes.values())
    names = metric_names(metrics_out)
    assert {p.get("gen_ai.operation.name") for p in names["gen_ai.client.operation.duration"]} >= {"chat", "rerank", "score"}
    assert {p.get("gen_ai.provider.name") for p in names["gen_ai.server.request.duration"]} >= {"anthropic"}
    stats = run.stats()
    assert stats.get("otelbpf.events.lost", 0) == 0
    assert not any(key.startswith("otelbpf.spans.failed") for key in stats), stats
