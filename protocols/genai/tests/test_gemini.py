"""Google's Gemini API (protocols/genai/apis/gemini.py): paths, requests, answers, and its two
stream framings (SSE with ``alt=sse``, a JSON array without), as the google-genai SDK and the
REST API use them; any bytes survived, any chunking the same facts."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from protocols.genai import match_endpoint
from protocols.genai.llm import LlmCall
from protocols.genai.tests.test_fuzz import FUZZ, split

GENERATE = "/v1beta/models/gemini-2.0-flash:generateContent"
STREAM = "/v1beta/models/gemini-2.0-flash:streamGenerateContent"
REQUEST = {
    "contents": [{"parts": [{"text": "hello mock world"}], "role": "user"}],
    "systemInstruction": {"parts": [{"text": "be brief"}], "role": "user"},
    "generationConfig": {"temperature": 0.3, "topP": 0.9, "maxOutputTokens": 3},
}


def answer(tokens: int, last: bool = True, sent: int | None = None, thoughts: int | None = None, number: int = 1) -> dict:
    """A GenerateContentResponse as Gemini writes it (a whole answer, or one stream event)."""
    candidate = {"content": {"parts": [{"text": "".join(f"tok{i} " for i in range(tokens))}], "role": "model"}, "index": 0}
    if last:
        candidate["finishReason"] = "MAX_TOKENS"
    usage = {"promptTokenCount": 5, "candidatesTokenCount": tokens if sent is None else sent, "totalTokenCount": 5 + tokens}
    if thoughts is not None:
        usage["thoughtsTokenCount"] = thoughts
    return {"candidates": [candidate], "usageMetadata": usage, "modelVersion": "gemini-2.0-flash-001",
            "responseId": f"resp-{number}"}  # fmt: skip


def stream_events(tokens: int) -> list[dict]:
    return [
        {**answer(1, last=i == tokens - 1, sent=i + 1), "candidates": [
            {"content": {"parts": [{"text": f"tok{i} "}], "role": "model"}, "index": 0,
             **({"finishReason": "STOP"} if i == tokens - 1 else {})}]}
        for i in range(tokens)
    ]  # fmt: skip


def sse(events: list[dict]) -> list[bytes]:
    return [b"data: " + json.dumps(e).encode() + b"\r\n\r\n" for e in events]


def json_array(events: list[dict]) -> list[bytes]:
    """The stream without alt=sse: '[', then the elements '\\n,\\r\\n' apart, then '\\n]'."""
    return [b"[" + json.dumps(events[0]).encode()] + [b"\n,\r\n" + json.dumps(e).encode() for e in events[1:]] + [b"\n]"]


def facts_of(path, pieces, request=REQUEST, content_type="application/json", capture_content=False):
    call = LlmCall(match_endpoint("POST", path), capture_content=capture_content)
    call.request_body(json.dumps(request).encode() if isinstance(request, dict) else request)
    call.response_start(content_type)
    for i, piece in enumerate(pieces):
        call.response_body(1000 + i, piece)
    facts = call.finish()
    assert call.finish() is facts  # it ends once: a second finish gives the same answer
    return facts, call


def test_paths():
    for path, operation, model, stream in (
        (GENERATE, "generate_content", "gemini-2.0-flash", False),
        (STREAM + "?alt=sse", "generate_content", "gemini-2.0-flash", True),
        ("/v1/models/gemini-2.5-pro:streamGenerateContent", "generate_content", "gemini-2.5-pro", True),
        ("/v1beta/models/text-embedding-004:embedContent", "embeddings", "text-embedding-004", False),
        ("/v1beta/models/text-embedding-004:batchEmbedContents", "embeddings", "text-embedding-004", False),
        ("/v1beta/tunedModels/my-model-1:generateContent", "generate_content", "my-model-1", False),
        ("/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.0-flash:generateContent",
         "generate_content", "gemini-2.0-flash", False),
        ("http://generativelanguage.googleapis.com/v1beta/models/gemini%2Dx:generateContent", "generate_content", "gemini-x", False),
    ):  # fmt: skip
        endpoint = match_endpoint("POST", path)
        assert endpoint is not None, path
        assert (endpoint.api.name, endpoint.operation, endpoint.model, endpoint.streaming) == ("gemini", operation, model, stream)
    for path in ("/v1beta/models/:generateContent", "/v1beta/files/x:generateContent", "/v1beta/models/m:countTokens",
                 "/v1beta/models/m", "/v1beta/models/m:generateContent/x"):  # fmt: skip
        assert match_endpoint("POST", path) is None, path
    assert match_endpoint("GET", GENERATE) is None


def test_generate_content():
    facts, call = facts_of(GENERATE, [json.dumps(answer(3, thoughts=2)).encode()], capture_content=True)
    assert call.errors == 0
    assert (facts.operation, facts.request_model, facts.response_model, facts.response_id) == (
        "generate_content", "gemini-2.0-flash", "gemini-2.0-flash-001", "resp-1")
    assert (facts.max_tokens, facts.temperature, facts.top_p, facts.stream) == (3, 0.3, 0.9, False)
    # thinking tokens are output tokens (as reasoning tokens are in OpenAI's completion tokens)
    assert (facts.input_tokens, facts.output_tokens, facts.finish_reasons) == (5, 5, ("MAX_TOKENS",))
    assert facts.input_messages == [("system", "be brief"), ("user", "hello mock world")]
    assert facts.output_text == "tok0 tok1 tok2 " and not facts.streamed and facts.chunks == 0


def test_sse_stream_and_json_array_stream_give_the_same_facts():
    events = stream_events(4)
    by_sse, _ = facts_of(STREAM + "?alt=sse", sse(events), content_type="text/event-stream")
    by_array, call = facts_of(STREAM, json_array(events))
    assert call.errors == call.parse_errors == 0
    for facts in (by_sse, by_array):
        assert (facts.stream, facts.streamed, facts.chunks, facts.first_chunk_ns, facts.last_chunk_ns) == (True, True, 4, 1000, 1003)
        assert (facts.input_tokens, facts.output_tokens, facts.finish_reasons, facts.response_id) == (5, 4, ("STOP",), "resp-1")
    sniffed, _ = facts_of(STREAM, json_array(events), content_type=None)  # no content type: the '[' tells
    assert sniffed.chunks == 4


def test_a_chunk_without_text_is_not_output():
    events = stream_events(2)
    events.append({"candidates": [{"content": {"parts": [{"text": ""}], "role": "model"}, "finishReason": "STOP", "index": 0}],
                   "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 2}})  # fmt: skip
    facts, _ = facts_of(STREAM + "?alt=sse", sse(events), content_type="text/event-stream")
    assert facts.chunks == 2 and facts.output_tokens == 2


def test_embeddings_and_a_refused_prompt():
    facts, _ = facts_of("/v1beta/models/text-embedding-004:batchEmbedContents",
                        [b'{"embeddings": [{"values": [0.1, 0.2]}, {"values": [0.3, 0.4]}]}'],
                        request={"requests": [{"model": "models/text-embedding-004", "content": {"parts": [{"text": "a"}]}}]},
                        capture_content=True)  # fmt: skip
    assert (facts.operation, facts.request_model, facts.stream, facts.input_messages) == (
        "embeddings", "text-embedding-004", None, [("user", "a")])
    blocked = {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 4}, "modelVersion": "m"}
    facts, _ = facts_of(GENERATE, [json.dumps(blocked).encode()])
    assert facts.finish_reasons == ("SAFETY",) and facts.input_tokens == 4 and facts.output_tokens is None


def test_an_answer_too_long_to_parse_is_read_from_its_ends():
    big = answer(3)
    big["candidates"][0]["content"]["parts"][0]["text"] = "x" * 200_000
    facts, _ = facts_of(GENERATE, [json.dumps(big).encode()])
    assert (facts.input_tokens, facts.output_tokens, facts.response_id, facts.finish_reasons) == (5, 3, "resp-1", ("MAX_TOKENS",))


def test_not_json_is_no_call():
    assert facts_of(GENERATE, [b"{}"], request=b"not json")[0] is None


@FUZZ
@given(tokens=st.integers(min_value=1, max_value=20), array=st.booleans(),
       cuts=st.lists(st.integers(min_value=0, max_value=100_000), max_size=10), capture=st.booleans())  # fmt: skip
def test_chunking_never_changes_the_facts(tokens, array, cuts, capture):
    data = b"".join(json_array(stream_events(tokens)) if array else sse(stream_events(tokens)))
    content_type = "application/json" if array else "text/event-stream"
    whole, call = facts_of(STREAM, [data], content_type=content_type, capture_content=capture)
    chunked, call2 = facts_of(STREAM, split(data, cuts), content_type=content_type, capture_content=capture)
    assert call.errors == call2.errors == call.parse_errors == call2.parse_errors == 0
    assert (whole.chunks, whole.output_tokens, whole.input_tokens, whole.finish_reasons, whole.output_text) == (
        chunked.chunks, chunked.output_tokens, chunked.input_tokens, chunked.finish_reasons, chunked.output_text)
    assert whole.chunks == tokens


@FUZZ
@given(data=st.binary(max_size=400), path=st.sampled_from([GENERATE, STREAM]),
       request=st.one_of(st.binary(max_size=200), st.just(json.dumps(REQUEST).encode())),
       content_type=st.sampled_from([None, "text/event-stream", "application/json"]),
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
    assert call.buffered <= 2 * 64 * 1024 + 3 * 16 * 1024
