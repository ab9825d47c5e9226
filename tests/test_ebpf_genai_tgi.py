"""Real eBPF, real processes: Hugging Face TGI native-API calls from the real
``huggingface_hub`` InferenceClient (``text_generation``, which posts to TGI's ``/``
compatibility route, streamed and not, with details) and httpx (``/generate`` and
``/generate_stream``) against the bundled mock (examples/openai_mock_server.py),
traced from the wire on both sides, the GenAI attributes equal to what the client received.

TGI names no model and no response id: spans are told apart by their max_new_tokens
and stream attributes, the CLIENT and SERVER spans of a call by the parent link."""

from __future__ import annotations

import textwrap

import pytest
from conftest import EXAMPLES
from test_ebpf_genai import CLIENT, SERVER, assert_stream_timing, metric_names, run_openai_client
from test_ebpf_http import spans_in_file

pytestmark = pytest.mark.ebpf

FIRST_TOKEN_DELAY_MS, TOKEN_DELAY_MS = 300, 40

CLIENT_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import httpx
    from huggingface_hub import InferenceClient

    port = int(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()
    client = InferenceClient(model=f"http://127.0.0.1:{port}", timeout=60)
    out = {}

    def received(details, text):
        return {"finish": details.finish_reason, "output": details.generated_tokens, "text": text}

    r = client.text_generation("hello mock world", max_new_tokens=3, details=True, temperature=0.5)
    out["plain"] = received(r.details, r.generated_text)
    events = list(client.text_generation("stream to the mock", details=True, stream=True))
    last = events[-1]
    out["stream"] = dict(received(last.details, last.generated_text), input=last.details.input_length,
                         tokens=sum(1 for e in events if not e.token.special))
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
    g = http.post("/generate", json={"inputs": "one two three four", "parameters": {
        "max_new_tokens": 2, "details": True, "decoder_input_details": True}}).json()
    out["generate"] = dict(received(type("D", (), g["details"]), g["generated_text"]), input=len(g["details"]["prefill"]))
    lines = [l for l in http.post("/generate_stream", json={"inputs": "a b", "parameters": {"max_new_tokens": 6}}).text.splitlines() if l]
    final = json.loads(lines[-1][5:])
    out["generate_stream"] = dict(received(type("D", (), final["details"]), final["generated_text"]),
                                  input=final["details"]["input_length"], tokens=len(lines))
    print(json.dumps(out), flush=True)
    """
)

#: call -> (max_new_tokens, streamed)
CALLS = {"plain": (3, False), "stream": (None, True), "generate": (2, False), "generate_stream": (6, True)}


def test_huggingface_hub_text_generation_gives_genai_spans_on_both_sides(services, agent, tmp_path):
    server = services(
        [str(EXAMPLES / "openai_mock_server.py"), "--port", "0",
         "--first-token-delay-ms", str(FIRST_TOKEN_DELAY_MS), "--token-delay-ms", str(TOKEN_DELAY_MS)]
    )  # fmt: skip
    out, metrics_out, sent, run, client_pid = run_openai_client(agent, tmp_path, server, CLIENT_SCRIPT)
    spans = [s for s in spans_in_file(out) if "gen_ai.operation.name" in s.attributes]
    assert len(spans) == 8, [(s.name, s.span.kind) for s in spans_in_file(out)]
    by_call = {
        (s.span.kind, s.attributes.get("gen_ai.request.max_tokens"), s.attributes["gen_ai.request.stream"]): s
        for s in spans
    }
    assert len(by_call) == 8, sorted(by_call)
    assert {s.resource["process.pid"] for s in spans if s.span.kind == SERVER} == {server.pid}
    assert {s.resource["process.pid"] for s in spans if s.span.kind == CLIENT} == {client_pid}

    for call, (max_tokens, streamed) in CALLS.items():
        expected = sent[call]
        client_span, server_span = by_call[(CLIENT, max_tokens, streamed)], by_call[(SERVER, max_tokens, streamed)]
        assert server_span.span.parent_span_id == client_span.span.span_id, call
        for s in (client_span, server_span):
            attrs = s.attributes
            assert s.name == "text_completion", (call, s.name)
            assert attrs["gen_ai.operation.name"] == "text_completion"
            assert attrs["gen_ai.provider.name"] == "huggingface.tgi"
            assert "gen_ai.request.model" not in attrs and "gen_ai.response.model" not in attrs
            assert attrs["gen_ai.response.finish_reasons"] == [expected["finish"]], call
            assert attrs["gen_ai.usage.output_tokens"] == expected["output"], call
            assert attrs.get("gen_ai.usage.input_tokens") == expected.get("input"), call
            assert attrs["http.request.method"] == "POST" and attrs["http.response.status_code"] == 200
            if streamed:  # chunks: the EOS token is not output
                assert_stream_timing(attrs, s.span.kind, expected["tokens"], FIRST_TOKEN_DELAY_MS, TOKEN_DELAY_MS, call)
            else:
                assert "gen_ai.response.time_to_first_chunk" not in attrs

    assert by_call[(CLIENT, 3, False)].attributes["gen_ai.request.temperature"] == 0.5
    assert sent["stream"]["finish"] == "eos_token" and sent["stream"]["output"] == sent["stream"]["tokens"] + 1
    assert sent["plain"].get("input") is None and sent["generate"]["input"] == 4
    names = metric_names(metrics_out)
    assert {p.get("gen_ai.provider.name") for p in names["gen_ai.client.operation.duration"]} >= {"huggingface.tgi"}
    assert {p.get("gen_ai.provider.name") for p in names["gen_ai.server.request.duration"]} >= {"huggingface.tgi"}
    stats = run.stats()
    assert stats.get("otelbpf.events.lost", 0) == 0
    assert not any(key.startswith("otelbpf.spans.failed") for key in stats), stats
