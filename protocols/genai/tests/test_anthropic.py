"""The Anthropic Messages API (/v1/messages): requests, JSON responses and named SSE streams."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from protocols.genai import llm
from protocols.genai import match_endpoint
from protocols.genai.llm import LlmCall
from protocols.genai.tests.test_fuzz import FUZZ, split

MESSAGES = match_endpoint("POST", "/v1/messages")
REQUEST = {
    "model": "claude-sonnet-4-5", "max_tokens": 1024, "temperature": 0.3, "top_p": 0.8, "stream": True,
    "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
    "messages": [{"role": "user", "content": [{"type": "text", "text": "hello there"}]}],
}  # fmt: skip


def sse(name: str, payload: dict, separators=(", ", ": ")) -> bytes:
    return f"event: {name}\ndata: {json.dumps(payload, separators=separators)}\n\n".encode()


def anthropic_stream(tokens: int, separators=(", ", ": "), named: bool = True) -> list[bytes]:
    usage = {"input_tokens": 12, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 100, "output_tokens": 1}
    message = {"id": "msg_01", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5-20250929",
               "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}  # fmt: skip
    events = [
        ("message_start", {"type": "message_start", "message": message}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ("ping", {"type": "ping"}),
    ]
    for i in range(tokens):
        events.append(("content_block_delta", {"type": "content_block_delta", "index": 0,
                                               "delta": {"type": "text_delta", "text": f"w{i} "}}))  # fmt: skip
    events += [
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                           "usage": {"output_tokens": tokens}}),  # fmt: skip
        ("message_stop", {"type": "message_stop"}),
    ]
    out = []
    for name, payload in events:
        event = sse(name, payload, separators)
        out.append(event if named else event.partition(b"\n")[2])
    return out


def facts_of(body_chunks, request=REQUEST, content_type="text/event-stream", capture_content=False):
    call = LlmCall(MESSAGES, capture_content=capture_content)
    call.request_body(json.dumps(request).encode())
    call.response_start(content_type)
    for i, chunk in enumerate(body_chunks):
        call.response_body(1000 + i, chunk)
    return call.finish(), call


def test_messages_path_is_recognised_but_not_assistants_thread_messages():
    assert match_endpoint("POST", "/v1/messages") == MESSAGES
    assert match_endpoint("POST", "/anthropic/v1/messages?beta=true") == MESSAGES
    assert match_endpoint("POST", "https://api.anthropic.com/v1/messages") == MESSAGES
    assert match_endpoint("POST", "/v1/threads/thread_1/messages") is None
    assert match_endpoint("GET", "/v1/messages") is None


def test_streamed_message_start_deltas_and_message_delta():
    facts, call = facts_of(anthropic_stream(5))
    assert call.errors == 0
    assert (facts.request_model, facts.max_tokens, facts.temperature, facts.top_p, facts.stream) == (
        "claude-sonnet-4-5", 1024, 0.3, 0.8, True)
    assert (facts.response_id, facts.response_model) == ("msg_01", "claude-sonnet-4-5-20250929")
    assert facts.finish_reasons == ("end_turn",)
    # the conventions' input tokens include the cached ones; the cache counts are kept apart
    assert (facts.input_tokens, facts.cache_read_input_tokens, facts.cache_creation_input_tokens) == (112, 100, 0)
    assert facts.output_tokens == 5
    # output chunks are the content_block_deltas only: the first one is the first token
    assert (facts.streamed, facts.chunks, facts.first_chunk_ns, facts.last_chunk_ns) == (True, 5, 1003, 1007)


def test_cheap_path_decodes_only_message_start_and_message_delta(monkeypatch):
    """content_block_delta (and ping, block start/stop, message_stop) are read from their
    event name alone; the uncompiled module shows it by counting json.loads calls."""
    calls = []
    real = llm.loads
    monkeypatch.setattr(llm, "loads", lambda data: calls.append(data) or real(data))
    facts, _ = facts_of([b"".join(anthropic_stream(50))])
    assert facts.chunks == 50 and facts.output_tokens == 50 and facts.finish_reasons == ("end_turn",)
    if llm.__file__.endswith(".py"):  # compiled, the module's own calls are C calls: not patched
        assert len(calls) == 3, calls  # the request, message_start, message_delta


def test_unnamed_events_and_compact_json_give_the_same_facts():
    expected = facts_of(anthropic_stream(20))[0]
    for separators in ((",", ":"), (", ", ": ")):
        for named in (True, False):
            facts, call = facts_of(anthropic_stream(20, separators, named))
            assert call.errors == 0
            assert (facts.chunks, facts.input_tokens, facts.output_tokens, facts.finish_reasons, facts.response_id) == (
                expected.chunks, expected.input_tokens, expected.output_tokens, expected.finish_reasons, expected.response_id)


def test_cumulative_message_delta_usage_overrides_message_start():
    events = anthropic_stream(3)
    events[-2] = sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
                                       "usage": {"input_tokens": 20, "cache_creation_input_tokens": 7,
                                                 "cache_read_input_tokens": 0, "output_tokens": 3}})  # fmt: skip
    facts, _ = facts_of(events)
    assert (facts.input_tokens, facts.cache_creation_input_tokens, facts.cache_read_input_tokens) == (27, 7, 0)
    assert facts.finish_reasons == ("max_tokens",)


def test_content_capture_of_a_stream():
    facts, _ = facts_of(anthropic_stream(3), capture_content=True)
    assert facts.output_text == "w0 w1 w2 "
    assert facts.input_messages == [("system", "be brief"), ("user", "hello there")]


def test_non_streamed_message():
    response = {
        "id": "msg_02", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
        "content": [{"type": "text", "text": "Hi!"}], "stop_reason": "stop_sequence", "stop_sequence": "###",
        "usage": {"input_tokens": 9, "output_tokens": 2, "cache_creation_input_tokens": 4, "cache_read_input_tokens": 0},
    }  # fmt: skip
    request = dict(REQUEST, stream=False)
    facts, _ = facts_of([json.dumps(response).encode()], request, "application/json", capture_content=True)
    assert (facts.response_id, facts.response_model, facts.finish_reasons) == ("msg_02", "claude-haiku-4-5", ("stop_sequence",))
    assert (facts.input_tokens, facts.output_tokens, facts.cache_creation_input_tokens) == (13, 2, 4)
    assert facts.streamed is False and facts.chunks == 0 and facts.stream is False
    assert facts.output_text == "Hi!"


def test_usage_without_cache_fields():
    response = {"id": "msg_03", "model": "m", "content": [], "stop_reason": "end_turn",
                "usage": {"input_tokens": 5, "output_tokens": 1}}  # fmt: skip
    facts, _ = facts_of([json.dumps(response).encode()], dict(REQUEST, stream=False), "application/json")
    assert (facts.input_tokens, facts.cache_read_input_tokens, facts.cache_creation_input_tokens) == (5, None, None)


def test_an_oversized_delta_is_still_one_chunk_and_usage_survives():
    events = anthropic_stream(2)
    big = sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                      "delta": {"type": "text_delta", "text": "x" * 200_000}})  # fmt: skip
    events.insert(4, big)
    facts, call = facts_of(events)
    assert call.errors == 0 and facts.chunks == 3 and facts.output_tokens == 2 and facts.input_tokens == 112


def test_an_error_event_is_not_output():
    events = anthropic_stream(0)[:1] + [sse("error", {"type": "error", "error": {"type": "overloaded_error", "message": "x"}})]
    facts, call = facts_of(events)
    assert call.errors == 0 and facts.chunks == 0 and facts.response_id == "msg_01"


@FUZZ
@given(st.lists(st.integers(min_value=0), max_size=12), st.booleans(), st.booleans())
def test_any_chunking_gives_the_same_facts(cuts, named, capture):
    data = b"".join(anthropic_stream(8, named=named))
    whole, _ = facts_of([data], capture_content=capture)
    facts, call = facts_of(split(data, cuts), capture_content=capture)
    assert call.errors == 0
    assert (facts.chunks, facts.input_tokens, facts.output_tokens, facts.finish_reasons, facts.response_id,
            facts.cache_read_input_tokens, facts.output_text) == (
        whole.chunks, whole.input_tokens, whole.output_tokens, whole.finish_reasons, whole.response_id,
        whole.cache_read_input_tokens, whole.output_text)  # fmt: skip


_FRAGMENTS = anthropic_stream(2) + [b"event: content_block_delta\n", b"data: {", b'"type"', b":", b"\n\n", b"\x00\xff"]


@FUZZ
@given(st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.binary(max_size=40)), max_size=30).map(b"".join),
       st.sampled_from(["text/event-stream", "application/json", ""]))  # fmt: skip
def test_any_bytes_never_raise_and_stay_bounded(data, content_type):
    call = LlmCall(MESSAGES)
    call.request_body(json.dumps(REQUEST).encode())
    call.response_start(content_type)
    for piece in split(data, [7, 31, 64]):
        call.response_body(1, piece)
        call.response_body(2, None) if piece.endswith(b"\xff") else None
    call.finish()
    assert call.errors == 0
    assert call.buffered < 300_000
