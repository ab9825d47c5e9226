"""LLM call recognition and field extraction, per API, streamed and not."""

from __future__ import annotations

import json

import pytest

from protocols.genai import match_endpoint
from protocols.genai.llm import REQUEST_BODY_LIMIT, RESPONSE_BODY_LIMIT, LlmCall


@pytest.mark.parametrize(
    ("method", "target", "expected"),
    [
        ("POST", "/v1/chat/completions", ("openai", "chat")),
        ("POST", "/v1/chat/completions?x=1", ("openai", "chat")),
        ("POST", "http://api.openai.com/v1/completions", ("openai", "text_completion")),
        ("POST", "/v1/embeddings", ("openai", "embeddings")),
        ("POST", "/v1/responses", ("openai_responses", "chat")),
        ("POST", "/proxy/openai/v1/chat/completions/", ("openai", "chat")),
        ("POST", "/openai/deployments/gpt4/chat/completions?api-version=2024-10-21", ("openai", "chat")),
        ("POST", "/api/chat", ("ollama", "chat")),
        ("POST", "/api/generate", ("ollama", "text_completion")),
        ("POST", "/api/embed", ("ollama", "embeddings")),
        ("POST", "http://ollama:11434/api/chat", ("ollama", "chat")),
        ("POST", "/inference.Inference/Predict", None),  # a gRPC method
        ("POST", "/v2/chat/completions", None),
        ("GET", "/v1/chat/completions", None),
        ("POST", "/chat/completions", None),
        ("POST", "/v1/models", None),
        ("POST", "/items/completions", None),
        ("POST", "", None),
        ("POST", "*", None),
    ],
)
def test_match_endpoint(method, target, expected) -> None:
    endpoint = match_endpoint(method, target)
    assert (None if endpoint is None else (endpoint.api.name, endpoint.operation)) == expected


def chat_call(request: dict, **kwargs) -> LlmCall:
    call = LlmCall(match_endpoint("POST", "/v1/chat/completions"), **kwargs)
    call.request_body(json.dumps(request).encode())
    return call


CHAT_REQUEST = {
    "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}],
    "model": "gpt-4o-mini",
    "max_tokens": 64,
    "temperature": 0.2,
    "top_p": 1,
}


def test_non_streamed_chat() -> None:
    call = chat_call(CHAT_REQUEST)
    call.response_start("application/json")
    body = {
        "id": "chatcmpl-1", "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    }  # fmt: skip
    raw = json.dumps(body).encode()
    call.response_body(100, raw[:10])
    call.response_body(101, raw[10:])
    facts = call.finish()
    assert facts is not None
    assert (facts.request_model, facts.max_tokens, facts.temperature, facts.top_p, facts.stream) == ("gpt-4o-mini", 64, 0.2, 1.0, False)
    assert (facts.response_id, facts.response_model, facts.finish_reasons) == ("chatcmpl-1", "gpt-4o-mini-2024-07-18", ("stop",))
    assert (facts.input_tokens, facts.output_tokens, facts.streamed, facts.chunks) == (12, 3, False, 0)
    assert facts.input_messages is None and facts.output_text is None  # content is opt-in


def sse(*objects) -> list[bytes]:
    return [b"data: " + (o if isinstance(o, bytes) else json.dumps(o).encode()) + b"\n\n" for o in objects]


def chunk(content=None, finish=None, usage=None, role=None, choices=True) -> dict:
    delta = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    out = {"id": "chatcmpl-9", "object": "chat.completion.chunk", "model": "m-1"}
    out["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}] if choices else []
    if usage:
        out["usage"] = usage
    return out


def test_streamed_chat_times_output_chunks_only_and_keeps_the_last_usage() -> None:
    call = chat_call({**CHAT_REQUEST, "stream": True, "stream_options": {"include_usage": True}}, capture_content=True)
    call.response_start("text/event-stream; charset=utf-8")
    events = sse(
        chunk(role="assistant", content=""),  # role chunk: not output
        chunk("Hel"),
        chunk("lo"),
        chunk(finish="stop"),
        chunk(usage={"prompt_tokens": 5, "completion_tokens": 2}, choices=False),
        b"[DONE]",
    )
    for ts, event in zip([10, 50, 70, 71, 72, 73], events):
        call.response_body(ts, event)
    facts = call.finish()
    assert (facts.first_chunk_ns, facts.last_chunk_ns, facts.chunks) == (50, 70, 2)
    assert (facts.input_tokens, facts.output_tokens, facts.finish_reasons) == (5, 2, ("stop",))
    assert facts.stream is True and facts.streamed and facts.response_id == "chatcmpl-9"
    assert facts.output_text == "Hello"
    assert facts.input_messages == [("system", "be brief"), ("user", "hello world")]


def test_a_streamed_response_of_any_length_keeps_its_usage_with_bounded_memory() -> None:
    call = chat_call({**CHAT_REQUEST, "stream": True})
    call.response_start("text/event-stream")
    piece = b"".join(sse(chunk("x" * 1000)))
    for i in range(2000):  # ~2 MB
        call.response_body(i, piece[: len(piece) // 2])
        call.response_body(i, piece[len(piece) // 2 :])
        assert call.buffered < 70_000
    for event in sse(chunk(finish="length"), chunk(usage={"prompt_tokens": 1, "completion_tokens": 2000}, choices=False), b"[DONE]"):
        call.response_body(5000, event)
    facts = call.finish()
    assert (facts.chunks, facts.output_tokens, facts.finish_reasons) == (2000, 2000, ("length",))


def test_embeddings_response_longer_than_the_limit_keeps_model_and_usage_from_its_tail() -> None:
    call = LlmCall(match_endpoint("POST", "/v1/embeddings"))
    call.request_body(json.dumps({"input": ["a b c"] * 3, "model": "text-embedding-3-small", "encoding_format": "float"}).encode())
    call.response_start("application/json")
    body = {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": [0.123456789] * 3072} for i in range(3)],
        "model": "text-embedding-3-small",
        "usage": {"prompt_tokens": 9, "total_tokens": 9},
    }
    raw = json.dumps(body).encode()
    assert len(raw) > RESPONSE_BODY_LIMIT
    for start in range(0, len(raw), 4096):
        call.response_body(1, raw[start : start + 4096])
    facts = call.finish()
    assert (facts.request_model, facts.response_model, facts.input_tokens, facts.output_tokens) == (
        "text-embedding-3-small", "text-embedding-3-small", 9, None,
    )  # fmt: skip
    assert facts.stream is None and call.buffered < RESPONSE_BODY_LIMIT + 20_000


def test_a_request_over_the_limit_is_read_from_its_head_and_tail() -> None:
    request = {"messages": [{"role": "user", "content": "w " * REQUEST_BODY_LIMIT}], "model": "big", "stream": True, "max_tokens": 7}
    call = chat_call(request, capture_content=True)
    facts = call.finish()
    assert (facts.request_model, facts.stream, facts.max_tokens) == ("big", True, 7)
    assert facts.input_messages is None and facts.content_truncated


def test_a_key_inside_a_string_is_not_mistaken_for_the_field() -> None:
    request = {"messages": [{"role": "user", "content": 'say "model": "evil" ' + "z" * REQUEST_BODY_LIMIT}], "model": "good"}
    assert chat_call(request).finish().request_model == "good"


def test_not_json_is_not_an_llm_call() -> None:
    call = LlmCall(match_endpoint("POST", "/v1/chat/completions"))
    call.request_body(b"model=x&prompt=y")
    assert call.finish() is None


def test_legacy_completions_stream() -> None:
    call = LlmCall(match_endpoint("POST", "/v1/completions"))
    call.request_body(json.dumps({"model": "davinci", "prompt": "once", "stream": True}).encode())
    call.response_start("text/event-stream")
    for ts, event in enumerate(sse({"id": "cmpl-1", "model": "davinci", "choices": [{"index": 0, "text": "up", "finish_reason": None}]},
                                   {"id": "cmpl-1", "model": "davinci", "choices": [{"index": 0, "text": "", "finish_reason": "stop"}]},
                                   b"[DONE]")):  # fmt: skip
        call.response_body(ts + 1, event)
    facts = call.finish()
    assert (facts.chunks, facts.first_chunk_ns, facts.finish_reasons, facts.response_id) == (1, 1, ("stop",), "cmpl-1")


def test_responses_api_stream() -> None:
    call = LlmCall(match_endpoint("POST", "/v1/responses"))
    call.request_body(json.dumps({"model": "gpt-5", "input": "hi", "stream": True, "max_output_tokens": 50}).encode())
    call.response_start("text/event-stream")
    stream = (
        b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_1","model":"gpt-5-2025","status":"in_progress"}}\n\n'
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"He"}\n\n'
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"y"}\n\n'
        b'event: response.completed\ndata: {"type":"response.completed","response":{"id":"resp_1","model":"gpt-5-2025",'
        b'"status":"completed","usage":{"input_tokens":4,"output_tokens":2}}}\n\n'
    )
    call.response_body(9, stream)
    facts = call.finish()
    assert (facts.response_id, facts.response_model, facts.max_tokens, facts.chunks) == ("resp_1", "gpt-5-2025", 50, 2)
    assert (facts.input_tokens, facts.output_tokens, facts.finish_reasons) == (4, 2, ("completed",))


def test_ollama_chat_streams_ndjson_by_default() -> None:
    call = LlmCall(match_endpoint("POST", "/api/chat"))
    call.request_body(json.dumps({"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "options": {"temperature": 0.7, "num_predict": 9}}).encode())
    call.response_start("application/x-ndjson")
    lines = [
        {"model": "llama3", "message": {"role": "assistant", "content": "He"}, "done": False},
        {"model": "llama3", "message": {"role": "assistant", "content": "y"}, "done": False},
        {"model": "llama3", "message": {"role": "assistant", "content": ""}, "done": True, "done_reason": "stop", "prompt_eval_count": 11, "eval_count": 2},
    ]
    for ts, line in enumerate(lines):
        call.response_body(ts + 1, json.dumps(line).encode() + b"\n")
    facts = call.finish()
    assert (facts.stream, facts.temperature, facts.max_tokens, facts.chunks, facts.last_chunk_ns) == (True, 0.7, 9, 2, 2)
    assert (facts.input_tokens, facts.output_tokens, facts.finish_reasons, facts.response_model) == (11, 2, ("stop",), "llama3")


def test_ollama_generate_not_streamed_and_sniffed_without_content_type() -> None:
    call = LlmCall(match_endpoint("POST", "/api/generate"))
    call.request_body(json.dumps({"model": "llama3", "prompt": "hi", "stream": False}).encode())
    call.response_start(None)
    call.response_body(5, json.dumps({"model": "llama3", "response": "hey", "done": True, "done_reason": "stop", "prompt_eval_count": 3, "eval_count": 1}).encode())
    facts = call.finish()
    assert (facts.streamed, facts.input_tokens, facts.output_tokens, facts.stream) == (False, 3, 1, False)


def test_content_capture_is_truncated_to_its_limit() -> None:
    call = chat_call({**CHAT_REQUEST, "stream": True}, capture_content=True, content_limit=12)
    call.response_start("text/event-stream")
    for event in sse(chunk("abcdefghij"), chunk("klmnop")):
        call.response_body(1, event)
    facts = call.finish()
    assert facts.input_messages == [("system", "be brief"), ("user", "hell")]
    assert facts.output_text == "abcdefghijkl"
    assert facts.content_truncated


def test_a_responses_completed_event_over_64_kib_still_yields_its_usage() -> None:
    call = LlmCall(match_endpoint("POST", "/v1/responses"))
    call.request_body(json.dumps({"model": "gpt-5", "input": "hi", "stream": True}).encode())
    call.response_start("text/event-stream")
    text = "word " * 30_000
    call.response_body(1, b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"word "}\n\n')
    completed = {
        "type": "response.completed",
        "response": {
            "id": "resp_9", "object": "response", "model": "gpt-5-2025", "status": "completed",
            "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}],
            "usage": {"input_tokens": 3, "output_tokens": 30000},
        },
    }  # fmt: skip
    raw = b"event: response.completed\ndata: " + json.dumps(completed).encode() + b"\n\n"
    assert len(raw) > 64 * 1024
    for start in range(0, len(raw), 5000):
        call.response_body(2, raw[start : start + 5000])
    facts = call.finish()
    assert (facts.response_id, facts.response_model, facts.input_tokens, facts.output_tokens) == ("resp_9", "gpt-5-2025", 3, 30000)
    assert facts.chunks == 1 and facts.finish_reasons == ("completed",)


def test_an_openai_chunk_over_64_kib_counts_and_keeps_its_usage() -> None:
    call = chat_call({**CHAT_REQUEST, "stream": True})
    call.response_start("text/event-stream")
    big = chunk("y" * 70_000)
    big["usage"] = {"prompt_tokens": 2, "completion_tokens": 1}
    for event in sse(big, b"[DONE]"):
        call.response_body(3, event)
    facts = call.finish()
    assert (facts.chunks, facts.input_tokens, facts.output_tokens, facts.response_id) == (1, 2, 1, "chatcmpl-9")


def test_a_json_call_that_names_no_model_anywhere_is_not_an_llm_call() -> None:
    call = LlmCall(match_endpoint("POST", "/api/chat"))
    call.request_body(b'{"room": "general", "text": "hi"}')
    call.response_start("application/json")
    call.response_body(1, b'{"ok": true}')
    assert call.finish() is None
