"""AWS Bedrock Runtime (protocols/genai/apis/bedrock.py): model ids from the path, Converse and
ConverseStream, InvokeModel and its stream for Anthropic and Meta Llama bodies, inside AWS's
binary event stream; any bytes survived, any chunking the same facts."""

from __future__ import annotations

import base64
import json

from hypothesis import given
from hypothesis import strategies as st

from protocols.genai import match_endpoint
from protocols.genai.eventstream import encode_message
from protocols.genai.llm import LlmCall
from protocols.genai.tests.test_fuzz import FUZZ, split

MODEL = "anthropic.claude-3-haiku-20240307-v1:0"
ENCODED = MODEL.replace(":", "%3A")
CONVERSE = {"messages": [{"role": "user", "content": [{"text": "hello mock world"}]}],
            "system": [{"text": "be brief"}], "inferenceConfig": {"maxTokens": 3, "temperature": 0.5, "topP": 0.9}}  # fmt: skip
ANTHROPIC = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 3, "temperature": 0.2,
             "messages": [{"role": "user", "content": "hello mock world"}]}  # fmt: skip
LLAMA = {"prompt": "hello mock world", "max_gen_len": 3, "temperature": 0.1, "top_p": 0.8}
EVENT_STREAM = "application/vnd.amazon.eventstream"


def event(name: str, payload: dict) -> bytes:
    return encode_message({":event-type": name, ":content-type": "application/json", ":message-type": "event"},
                          json.dumps({**payload, "p": "abcd"}).encode())  # fmt: skip


def chunk(payload: dict) -> bytes:
    return event("chunk", {"bytes": base64.b64encode(json.dumps(payload).encode()).decode()})


def converse_stream(tokens: int) -> list[bytes]:
    return (
        [event("messageStart", {"role": "assistant"})]
        + [event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": f"tok{i} "}}) for i in range(tokens)]
        + [event("contentBlockStop", {"contentBlockIndex": 0}), event("messageStop", {"stopReason": "max_tokens"}),
           event("metadata", {"usage": {"inputTokens": 4, "outputTokens": tokens, "cacheReadInputTokens": 2,
                                        "cacheWriteInputTokens": 0}, "metrics": {"latencyMs": 9}})]
    )  # fmt: skip


def anthropic_stream(tokens: int) -> list[bytes]:
    start = {"id": "msg_bdrk_1", "type": "message", "role": "assistant", "model": "claude-3-haiku-20240307",
             "content": [], "usage": {"input_tokens": 4, "output_tokens": 1}}  # fmt: skip
    return (
        [chunk({"type": "message_start", "message": start}), chunk({"type": "content_block_start", "index": 0})]
        + [chunk({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": f"t{i} "}})
           for i in range(tokens)]
        + [chunk({"type": "content_block_stop", "index": 0}),
           chunk({"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": tokens}}),
           chunk({"type": "message_stop", "amazon-bedrock-invocationMetrics": {"inputTokenCount": 4, "outputTokenCount": tokens}})]
    )  # fmt: skip


def llama_stream(tokens: int) -> list[bytes]:
    out = []
    for i in range(tokens):
        piece = {"generation": f"t{i} ", "prompt_token_count": 4 if i == 0 else None, "generation_token_count": i + 1,
                 "stop_reason": "length" if i == tokens - 1 else None}  # fmt: skip
        if i == tokens - 1:
            piece["amazon-bedrock-invocationMetrics"] = {"inputTokenCount": 4, "outputTokenCount": tokens}
        out.append(chunk(piece))
    return out


def facts_of(path, pieces, request, content_type="application/json", request_id="req-1", capture_content=False):
    call = LlmCall(match_endpoint("POST", path), capture_content=capture_content)
    call.request_body(json.dumps(request).encode() if isinstance(request, dict) else request)
    call.response_start(content_type)
    call.header(True, "x-amzn-requestid", request_id)
    for i, piece in enumerate(pieces):
        call.response_body(1000 + i, piece)
    facts = call.finish()
    assert call.finish() is facts  # it ends once
    return facts, call


def test_paths_and_model_ids():
    arn = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.meta.llama3-1-8b-instruct-v1:0"
    encoded = arn.replace(":", "%3A").replace("/", "%2F")
    for path, model, route, stream in (
        (f"/model/{ENCODED}/converse", MODEL, "converse", False),
        (f"/model/{ENCODED}/converse-stream", MODEL, "converse", True),
        (f"/model/{encoded}/invoke", arn, "invoke", False),
        (f"/model/{MODEL}/invoke-with-response-stream", MODEL, "invoke", True),
        (f"https://bedrock-runtime.us-east-1.amazonaws.com/model/{ENCODED}/converse", MODEL, "converse", False),
    ):
        endpoint = match_endpoint("POST", path)
        assert (endpoint.api.name, endpoint.model, endpoint.route, endpoint.streaming) == ("bedrock", model, route, stream)
    for path in ("/model//converse", "/model/m/x/converse", "/models/m/converse", "/v1/model/m/converse", "/model/m/invoke2"):
        assert match_endpoint("POST", path) is None, path


def test_converse():
    answer = {"output": {"message": {"role": "assistant", "content": [{"text": "tok0 tok1 tok2 "}]}},
              "stopReason": "max_tokens", "usage": {"inputTokens": 4, "outputTokens": 3, "totalTokens": 9,
                                                    "cacheReadInputTokens": 2, "cacheWriteInputTokens": 0}}  # fmt: skip
    facts, call = facts_of(f"/model/{ENCODED}/converse", [json.dumps(answer).encode()], CONVERSE, capture_content=True)
    assert call.errors == 0
    assert (facts.operation, facts.request_model, facts.response_model, facts.response_id) == ("chat", MODEL, None, "req-1")
    assert (facts.max_tokens, facts.temperature, facts.top_p, facts.stream) == (3, 0.5, 0.9, False)
    # the conventions' input tokens include cached ones (Converse's inputTokens do not)
    assert (facts.input_tokens, facts.cache_read_input_tokens, facts.output_tokens) == (6, 2, 3)
    assert facts.finish_reasons == ("max_tokens",) and facts.output_text == "tok0 tok1 tok2 "
    assert facts.input_messages == [("system", "be brief"), ("user", "hello mock world")]


def test_converse_stream():
    facts, call = facts_of(f"/model/{ENCODED}/converse-stream", converse_stream(5), CONVERSE, EVENT_STREAM)
    assert call.errors == call.parse_errors == 0
    assert (facts.stream, facts.streamed, facts.chunks, facts.first_chunk_ns, facts.last_chunk_ns) == (True, True, 5, 1001, 1005)
    assert (facts.input_tokens, facts.output_tokens, facts.finish_reasons, facts.response_id) == (6, 5, ("max_tokens",), "req-1")


def test_invoke_anthropic_and_llama():
    message = {"id": "msg_bdrk_9", "type": "message", "model": "claude-3-haiku-20240307", "stop_reason": "end_turn",
               "content": [{"type": "text", "text": "hi"}], "usage": {"input_tokens": 4, "output_tokens": 1,
                                                                     "cache_read_input_tokens": 3}}  # fmt: skip
    facts, _ = facts_of(f"/model/{ENCODED}/invoke", [json.dumps(message).encode()], ANTHROPIC)
    assert (facts.operation, facts.response_id, facts.response_model, facts.max_tokens, facts.temperature) == (
        "chat", "msg_bdrk_9", "claude-3-haiku-20240307", 3, 0.2)  # the body's id wins over the request id
    assert (facts.input_tokens, facts.cache_read_input_tokens, facts.output_tokens, facts.finish_reasons) == (7, 3, 1, ("end_turn",))
    answer = {"generation": "t0 t1 t2 ", "prompt_token_count": 4, "generation_token_count": 3, "stop_reason": "length"}
    facts, _ = facts_of("/model/meta.llama3-8b-instruct-v1%3A0/invoke", [json.dumps(answer).encode()], LLAMA, capture_content=True)
    assert (facts.operation, facts.request_model, facts.response_id, facts.max_tokens, facts.top_p) == (
        "text_completion", "meta.llama3-8b-instruct-v1:0", "req-1", 3, 0.8)
    assert (facts.input_tokens, facts.output_tokens, facts.finish_reasons, facts.output_text) == (4, 3, ("length",), "t0 t1 t2 ")
    assert facts.input_messages == [("user", "hello mock world")]


def test_invoke_streams():
    facts, call = facts_of(f"/model/{ENCODED}/invoke-with-response-stream", anthropic_stream(4), ANTHROPIC, EVENT_STREAM)
    assert call.errors == call.parse_errors == 0
    assert (facts.stream, facts.chunks, facts.first_chunk_ns, facts.response_id, facts.response_model) == (
        True, 4, 1002, "msg_bdrk_1", "claude-3-haiku-20240307")
    assert (facts.input_tokens, facts.output_tokens, facts.finish_reasons) == (4, 4, ("max_tokens",))
    facts, _ = facts_of("/model/meta.llama3-8b-instruct-v1%3A0/invoke-with-response-stream", llama_stream(3), LLAMA, EVENT_STREAM)
    assert (facts.operation, facts.chunks, facts.first_chunk_ns, facts.input_tokens, facts.output_tokens) == (
        "text_completion", 3, 1000, 4, 3)
    assert facts.finish_reasons == ("length",)
    bare = [chunk({"outputText": "x"}), chunk({"amazon-bedrock-invocationMetrics": {"inputTokenCount": 2, "outputTokenCount": 1}})]
    facts, _ = facts_of("/model/amazon.titan-text-express-v1/invoke-with-response-stream", bare, {"inputText": "hi"}, EVENT_STREAM)
    assert (facts.input_tokens, facts.output_tokens) == (2, 1)  # any model: the invocation metrics


def test_a_bad_crc_is_counted_and_its_event_not_trusted():
    events = converse_stream(3)
    bad = bytearray(events[2])
    bad[-6] ^= 0x01  # the second token's payload
    events[2] = bytes(bad)
    facts, call = facts_of(f"/model/{ENCODED}/converse-stream", events, CONVERSE, EVENT_STREAM)
    assert call.parse_errors == 1 and facts.chunks == 2 and facts.output_tokens == 3


def test_an_exception_in_the_stream_is_no_output():
    events = converse_stream(2)[:2] + [encode_message({":exception-type": "modelStreamErrorException",
                                                       ":message-type": "exception"}, b'{"message":"x"}')]  # fmt: skip
    facts, call = facts_of(f"/model/{ENCODED}/converse-stream", events, CONVERSE, EVENT_STREAM)
    assert facts.chunks == 1 and facts.output_tokens is None and call.parse_errors == 0


@FUZZ
@given(tokens=st.integers(min_value=1, max_value=20), kind=st.sampled_from(["converse", "anthropic", "llama"]),
       cuts=st.lists(st.integers(min_value=0, max_value=100_000), max_size=10), capture=st.booleans())  # fmt: skip
def test_chunking_never_changes_the_facts(tokens, kind, cuts, capture):
    path, events, request = {
        "converse": (f"/model/{ENCODED}/converse-stream", converse_stream(tokens), CONVERSE),
        "anthropic": (f"/model/{ENCODED}/invoke-with-response-stream", anthropic_stream(tokens), ANTHROPIC),
        "llama": ("/model/meta.llama3/invoke-with-response-stream", llama_stream(tokens), LLAMA),
    }[kind]
    data = b"".join(events)
    whole, call = facts_of(path, [data], request, EVENT_STREAM, capture_content=capture)
    chunked, call2 = facts_of(path, split(data, cuts), request, EVENT_STREAM, capture_content=capture)
    assert call.errors == call2.errors == call.parse_errors == call2.parse_errors == 0
    assert (whole.chunks, whole.output_tokens, whole.input_tokens, whole.finish_reasons, whole.output_text) == (
        chunked.chunks, chunked.output_tokens, chunked.input_tokens, chunked.finish_reasons, chunked.output_text)
    assert whole.chunks == tokens


@FUZZ
@given(data=st.lists(st.one_of(st.binary(max_size=60), st.sampled_from(converse_stream(2) + anthropic_stream(1))),
                     max_size=8).map(b"".join),
       path=st.sampled_from([f"/model/{ENCODED}/converse-stream", f"/model/{ENCODED}/invoke-with-response-stream",
                             f"/model/{ENCODED}/invoke", f"/model/{ENCODED}/converse"]),
       request=st.one_of(st.binary(max_size=100), st.sampled_from([json.dumps(CONVERSE).encode(), json.dumps(ANTHROPIC).encode(),
                                                                   json.dumps(LLAMA).encode()])),
       content_type=st.sampled_from([None, EVENT_STREAM, "application/json"]),
       cuts=st.lists(st.integers(min_value=0, max_value=1000), max_size=6), gap=st.booleans())  # fmt: skip
def test_survives_anything(data, path, request, content_type, cuts, gap):
    call = LlmCall(match_endpoint("POST", path))
    call.request_body(request)
    call.response_start(content_type)
    for i, piece in enumerate(split(data, cuts)):
        call.response_body(i, piece)
        if gap and i == 0:
            call.response_body(i, None)
    facts = call.finish()
    assert call.errors == 0 and call.finish() is facts
    assert call.buffered <= 2 * 64 * 1024 + 3 * 16 * 1024 + 128 * 1024 + len(data)
