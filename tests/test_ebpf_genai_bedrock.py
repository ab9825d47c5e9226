"""Real eBPF, real processes: AWS Bedrock Runtime calls (the real ``boto3`` ``bedrock-runtime``
client, dummy credentials) against examples/bedrock_mock_server.py, traced from the wire on
both sides: CLIENT spans in the client's process, SERVER spans in the mock's, with the GenAI
names and attributes equal to what the client received; TTFT on the two event-stream
responses (converse-stream, invoke-with-response-stream)."""

from __future__ import annotations

import textwrap

import pytest
from conftest import EXAMPLES
from test_ebpf_genai import CLIENT, SERVER, assert_stream_timing, metric_names, run_openai_client
from test_ebpf_http import spans_in_file

pytestmark = pytest.mark.ebpf

FIRST_TOKEN_DELAY_MS, TOKEN_DELAY_MS = 300, 40
SECRET = "bedrock-test-SECRET-not-to-be-exported"
CLAUDE = "anthropic.claude-3-haiku-20240307-v1:0"
LLAMA = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.meta.llama3-1-8b-instruct-v1:0"

CLIENT_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import boto3
    from botocore.config import Config

    port = int(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()
    client = boto3.client("bedrock-runtime", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                          aws_access_key_id="AKIDTEST", aws_secret_access_key=SECRET,
                          config=Config(retries={"max_attempts": 1}, read_timeout=60))
    out = {}
    r = client.converse(modelId=CLAUDE, messages=[{"role": "user", "content": [{"text": "hello mock world"}]}],
                        system=[{"text": "a cached system prompt"}, {"cachePoint": {"type": "default"}}],
                        inferenceConfig={"maxTokens": 4, "temperature": 0.5, "topP": 0.9})
    u = r["usage"]
    out["converse"] = {"id": r["ResponseMetadata"]["RequestId"], "stop": r["stopReason"], "input": u["inputTokens"],
                       "cache_read": u.get("cacheReadInputTokens", 0), "output": u["outputTokens"]}
    r = client.converse_stream(modelId=CLAUDE, messages=[{"role": "user", "content": [{"text": "stream please"}]}],
                               inferenceConfig={"maxTokens": 6})
    deltas, stop, usage = 0, None, None
    for event in r["stream"]:
        deltas += "contentBlockDelta" in event
        stop = event["messageStop"]["stopReason"] if "messageStop" in event else stop
        usage = event["metadata"]["usage"] if "metadata" in event else usage
    out["converse_stream"] = {"id": r["ResponseMetadata"]["RequestId"], "stop": stop, "input": usage["inputTokens"],
                              "cache_read": 0, "output": usage["outputTokens"], "chunks": deltas}
    r = client.invoke_model(modelId=LLAMA, body=json.dumps({"prompt": "once upon a time", "max_gen_len": 3, "top_p": 0.8}))
    b = json.loads(r["body"].read())
    out["invoke"] = {"id": r["ResponseMetadata"]["RequestId"], "stop": b["stop_reason"], "input": b["prompt_token_count"],
                     "cache_read": 0, "output": b["generation_token_count"]}
    r = client.invoke_model_with_response_stream(modelId=CLAUDE, body=json.dumps(
        {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 5, "messages": [{"role": "user", "content": "stream on"}]}))
    events = [json.loads(e["chunk"]["bytes"]) for e in r["body"]]
    start = events[0]["message"]
    out["invoke_stream"] = {"id": start["id"], "model": start["model"], "stop": events[-2]["delta"]["stop_reason"],
                            "input": start["usage"]["input_tokens"], "cache_read": 0,
                            "output": events[-2]["usage"]["output_tokens"],
                            "chunks": sum(e["type"] == "content_block_delta" for e in events)}
    print(json.dumps(out), flush=True)
    """
).replace("SECRET", repr(SECRET)).replace("CLAUDE", repr(CLAUDE)).replace("LLAMA", repr(LLAMA))


def test_boto3_bedrock_runtime_gives_genai_spans_on_both_sides(services, agent, tmp_path):
    server = services(
        [str(EXAMPLES / "bedrock_mock_server.py"), "--port", "0",
         "--first-token-delay-ms", str(FIRST_TOKEN_DELAY_MS), "--token-delay-ms", str(TOKEN_DELAY_MS)]
    )  # fmt: skip
    out, metrics_out, sent, run, client_pid = run_openai_client(agent, tmp_path, server, CLIENT_SCRIPT)
    spans = [s for s in spans_in_file(out) if "gen_ai.operation.name" in s.attributes]
    assert len(spans) == 8, [(s.name, s.span.kind) for s in spans_in_file(out)]
    assert {s.resource["process.pid"] for s in spans if s.span.kind == SERVER} == {server.pid}
    assert {s.resource["process.pid"] for s in spans if s.span.kind == CLIENT} == {client_pid}
    by_side = {(s.span.kind, s.attributes["gen_ai.response.id"]): s for s in spans}

    for call, model, operation, streamed in (
        ("converse", CLAUDE, "chat", False), ("converse_stream", CLAUDE, "chat", True),
        ("invoke", LLAMA, "text_completion", False), ("invoke_stream", CLAUDE, "chat", True),
    ):  # fmt: skip
        expected = sent[call]
        client_span, server_span = by_side[(CLIENT, expected["id"])], by_side[(SERVER, expected["id"])]
        assert server_span.span.parent_span_id == client_span.span.span_id
        for s in (client_span, server_span):
            attrs = s.attributes
            assert s.name == f"{operation} {model}"
            assert attrs["gen_ai.operation.name"] == operation
            assert attrs["gen_ai.provider.name"] == "aws.bedrock"
            assert attrs["gen_ai.request.model"] == model  # percent-decoded from the path
            assert attrs.get("gen_ai.response.model") == expected.get("model")
            assert attrs["gen_ai.response.finish_reasons"] == [expected["stop"]]
            # the conventions' input tokens include the cached ones (Converse's do not)
            assert attrs["gen_ai.usage.input_tokens"] == expected["input"] + expected["cache_read"]
            assert attrs.get("gen_ai.usage.cache_read.input_tokens") == (expected["cache_read"] or None)
            assert attrs["gen_ai.usage.output_tokens"] == expected["output"]
            assert attrs["gen_ai.request.stream"] is streamed
            assert attrs["http.request.method"] == "POST" and attrs["http.response.status_code"] == 200
        if streamed:
            for s in (client_span, server_span):
                assert_stream_timing(s.attributes, s.span.kind, expected["chunks"], FIRST_TOKEN_DELAY_MS, TOKEN_DELAY_MS, call)
        else:
            assert "gen_ai.response.time_to_first_chunk" not in client_span.attributes

    converse = by_side[(CLIENT, sent["converse"]["id"])].attributes
    assert (converse["gen_ai.request.max_tokens"], converse["gen_ai.request.temperature"], converse["gen_ai.request.top_p"]) == (
        4, 0.5, 0.9)
    assert sent["converse"]["cache_read"] == 4 and sent["converse_stream"]["chunks"] == 6
    invoke = by_side[(CLIENT, sent["invoke"]["id"])].attributes
    assert (invoke["gen_ai.request.max_tokens"], invoke["gen_ai.request.top_p"]) == (3, 0.8)

    for s in spans_in_file(out):  # never the secret (the signature's key is never sent; Authorization is never read)
        assert not any(SECRET in str(value) for value in s.attributes.values())
        assert not any("AWS4-HMAC" in str(value) for value in s.attributes.values())
    names = metric_names(metrics_out)
    assert {p.get("gen_ai.operation.name") for p in names["gen_ai.client.operation.duration"]} >= {"chat", "text_completion"}
    assert {p.get("gen_ai.provider.name") for p in names["gen_ai.server.request.duration"]} >= {"aws.bedrock"}
    stats = run.stats()
    assert stats.get("otelbpf.events.lost", 0) == 0
    # no span failed, and every event-stream message's CRCs held (a failure counts as a parse error)
    assert not any(key.startswith(("otelbpf.spans.failed", "otelbpf.parse.errors")) for key in stats), stats
