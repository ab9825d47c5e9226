"""Real eBPF, real processes: Google Gemini API calls (the real ``google-genai`` SDK, and httpx
for the stream without ``alt=sse``) against examples/gemini_mock_server.py, traced from the
wire on both sides: CLIENT spans in the client's process, SERVER spans in the mock's, with
the GenAI names and attributes equal to what the client received, TTFT on both streams
(SSE and the JSON array)."""

from __future__ import annotations

import textwrap

import pytest
from conftest import EXAMPLES
from test_ebpf_genai import CLIENT, SERVER, assert_stream_timing, metric_names, run_openai_client
from test_ebpf_http import spans_in_file

pytestmark = pytest.mark.ebpf

FIRST_TOKEN_DELAY_MS, TOKEN_DELAY_MS = 300, 40
SECRET = "gemini-test-SECRET-not-to-be-exported"

CLIENT_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import httpx
    from google import genai
    from google.genai import types

    port = int(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()
    client = genai.Client(api_key=SECRET, http_options=types.HttpOptions(
        base_url=f"http://127.0.0.1:{port}", api_version="v1beta", timeout=60_000))
    out = {}

    def received(r):
        u = r.usage_metadata
        return {"id": r.response_id, "model": r.model_version, "finish": r.candidates[0].finish_reason.value,
                "input": u.prompt_token_count, "output": u.candidates_token_count, "thoughts": u.thoughts_token_count}

    config = types.GenerateContentConfig(max_output_tokens=4, temperature=0.5, top_p=0.9, system_instruction="be brief",
                                         thinking_config=types.ThinkingConfig(thinking_budget=2))
    out["generate"] = received(client.models.generate_content(model="gemini-2.0-flash", contents="hello mock world",
                                                              config=config))
    events = list(client.models.generate_content_stream(model="gemini-2.0-flash", contents="stream please",
                                                        config=types.GenerateContentConfig(max_output_tokens=6)))
    out["stream"] = dict(received(events[-1]), text="".join(e.text for e in events), events=len(events))
    embedded = client.models.embed_content(model="text-embedding-004", contents=["first text", "second text"])
    out["embed"] = {"vectors": len(embedded.embeddings)}
    body = {"contents": [{"role": "user", "parts": [{"text": "an array stream"}]}], "generationConfig": {"maxOutputTokens": 5}}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
        answer = http.post("/v1/models/gemini-2.5-flash:streamGenerateContent", json=body,
                           headers={"x-goog-api-key": SECRET}).json()
    last = answer[-1]
    out["array"] = {"id": last["responseId"], "model": last["modelVersion"], "finish": last["candidates"][0]["finishReason"],
                    "input": last["usageMetadata"]["promptTokenCount"], "output": last["usageMetadata"]["candidatesTokenCount"],
                    "events": len(answer)}
    print(json.dumps(out), flush=True)
    """
).replace("SECRET", repr(SECRET))


def test_google_genai_sdk_gives_genai_spans_on_both_sides(services, agent, tmp_path):
    server = services(
        [str(EXAMPLES / "gemini_mock_server.py"), "--port", "0",
         "--first-token-delay-ms", str(FIRST_TOKEN_DELAY_MS), "--token-delay-ms", str(TOKEN_DELAY_MS)]
    )  # fmt: skip
    out, metrics_out, sent, run, client_pid = run_openai_client(agent, tmp_path, server, CLIENT_SCRIPT)
    spans = [s for s in spans_in_file(out) if "gen_ai.operation.name" in s.attributes]
    assert len(spans) == 8, [(s.name, s.span.kind) for s in spans_in_file(out)]
    assert {s.resource["process.pid"] for s in spans if s.span.kind == SERVER} == {server.pid}
    assert {s.resource["process.pid"] for s in spans if s.span.kind == CLIENT} == {client_pid}
    by_side = {(s.span.kind, s.attributes.get("gen_ai.response.id", s.attributes["gen_ai.operation.name"])): s for s in spans}

    for call, model, streamed in (("generate", "gemini-2.0-flash", False), ("stream", "gemini-2.0-flash", True),
                                  ("array", "gemini-2.5-flash", True)):  # fmt: skip
        expected = sent[call]
        client_span, server_span = by_side[(CLIENT, expected["id"])], by_side[(SERVER, expected["id"])]
        assert server_span.span.parent_span_id == client_span.span.span_id
        for s in (client_span, server_span):
            attrs = s.attributes
            assert s.name == f"generate_content {model}"
            assert attrs["gen_ai.operation.name"] == "generate_content"
            assert attrs["gen_ai.provider.name"] == "gcp.gemini"
            assert attrs["gen_ai.request.model"] == model
            assert attrs["gen_ai.response.model"] == expected["model"]
            assert attrs["gen_ai.response.finish_reasons"] == [expected["finish"]]
            assert attrs["gen_ai.usage.input_tokens"] == expected["input"]
            # thinking tokens count as output tokens
            assert attrs["gen_ai.usage.output_tokens"] == expected["output"] + (expected.get("thoughts") or 0)
            assert attrs["gen_ai.request.stream"] is streamed
            assert attrs["http.request.method"] == "POST" and attrs["http.response.status_code"] == 200
        if streamed:
            for s in (client_span, server_span):
                assert_stream_timing(s.attributes, s.span.kind, expected["events"], FIRST_TOKEN_DELAY_MS, TOKEN_DELAY_MS, call)
        else:
            assert "gen_ai.response.time_to_first_chunk" not in client_span.attributes

    generate = by_side[(CLIENT, sent["generate"]["id"])].attributes
    assert (generate["gen_ai.request.max_tokens"], generate["gen_ai.request.temperature"], generate["gen_ai.request.top_p"]) == (
        4, 0.5, 0.9)
    assert sent["generate"]["thoughts"] == 2 and sent["stream"]["text"] == "tok0 tok1 tok2 tok3 tok4 tok5 "
    client_embed, server_embed = by_side[(CLIENT, "embeddings")], by_side[(SERVER, "embeddings")]
    assert server_embed.span.parent_span_id == client_embed.span.span_id
    for s in (client_embed, server_embed):
        assert s.name == "embeddings text-embedding-004" and s.attributes["gen_ai.provider.name"] == "gcp.gemini"
        assert "gen_ai.request.stream" not in s.attributes and sent["embed"]["vectors"] == 2

    for s in spans_in_file(out):  # never the API key (x-goog-api-key is never read)
        assert not any(SECRET in str(value) for value in s.attributes.values())
    names = metric_names(metrics_out)
    assert {p.get("gen_ai.operation.name") for p in names["gen_ai.client.operation.duration"]} >= {"generate_content", "embeddings"}
    assert {p.get("gen_ai.provider.name") for p in names["gen_ai.server.request.duration"]} >= {"gcp.gemini"}
    stats = run.stats()
    assert stats.get("otelbpf.events.lost", 0) == 0
    assert not any(key.startswith("otelbpf.spans.failed") for key in stats), stats
