"""Hugging Face TGI's native API (/generate, /generate_stream, and its compatibility
route /): requests, JSON responses (an object, or /'s one-element list) and SSE streams."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from protocols.genai import llm, match_endpoint
from protocols.genai.chunks import tgi_plain_event
from protocols.genai.llm import LlmCall
from protocols.genai.tests.test_fuzz import FUZZ, split

TGI = match_endpoint("POST", "/generate")
REQUEST = {"inputs": "hello mock world", "parameters": {"max_new_tokens": 3, "temperature": 0.5, "top_p": 0.9, "details": True}}


def compact(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


def token(i: int, special: bool = False) -> dict:
    return {"id": 100 + i, "text": "</s>" if special else f"t{i} ", "logprob": -0.5, "special": special}


def tgi_stream(tokens: int, eos: bool = False, space: str = "", input_length: int | None = 3) -> list[bytes]:
    """TGI's SSE: one event per token, the last with generated_text and details."""
    toks = [token(i) for i in range(tokens)] + ([token(tokens, special=True)] if eos else [])
    out = []
    for i, tok in enumerate(toks):
        event = {"index": i + 1, "token": tok, "generated_text": None, "details": None, "top_tokens": None}
        if i == len(toks) - 1:
            details = {"finish_reason": "eos_token" if eos else "length", "generated_tokens": len(toks), "seed": None}
            if input_length is not None:
                details["input_length"] = input_length
            event.update(generated_text="".join(t["text"] for t in toks if not t["special"]), details=details)
        out.append(f"data:{space}{compact(event)}\n\n".encode())
    return out


def facts_of(chunks, request=REQUEST, content_type="text/event-stream", capture_content=False, endpoint=TGI):
    call = LlmCall(endpoint, capture_content=capture_content)
    call.request_body(json.dumps(request).encode() if isinstance(request, dict) else request)
    call.response_start(content_type)
    for i, chunk in enumerate(chunks):
        call.response_body(1000 + i, chunk)
    return call.finish(), call


def test_tgi_paths():
    for path in ("/", "/generate", "/generate_stream", "/generate_stream?x=1", "/?a=b", "http://h:80/generate"):
        assert match_endpoint("POST", path) == TGI, path
    assert match_endpoint("GET", "/generate") is None
    assert match_endpoint("POST", "/api/generate").api.name == "ollama"
    assert match_endpoint("POST", "/generate/x") is None
    assert match_endpoint("POST", "/pkg.Service/Method") is None


def test_generate_json_with_details():
    answer = {"generated_text": "t0 t1 t2 ", "details": {"finish_reason": "length", "generated_tokens": 3, "seed": None,
                                                         "prefill": [], "tokens": [token(i) for i in range(3)]}}  # fmt: skip
    facts, call = facts_of([compact(answer).encode()], content_type="application/json")
    assert call.errors == 0
    assert (facts.request_model, facts.response_model, facts.max_tokens, facts.temperature, facts.top_p) == (
        None, None, 3, 0.5, 0.9)
    assert (facts.stream, facts.streamed, facts.output_tokens, facts.input_tokens, facts.finish_reasons) == (
        False, False, 3, None, ("length",))


def test_compat_route_list_and_prefill_input_tokens():
    prefill = [{"id": 1, "text": w, "logprob": None} for w in ("hello", "mock", "world")]
    answer = [{"generated_text": "x", "details": {"finish_reason": "eos_token", "generated_tokens": 2, "prefill": prefill}}]
    facts, _ = facts_of([compact(answer).encode()], content_type="application/json", capture_content=True)
    assert (facts.input_tokens, facts.output_tokens, facts.finish_reasons) == (3, 2, ("eos_token",))
    assert facts.input_messages == [("user", "hello mock world")] and facts.output_text == "x"


def test_without_details_still_a_call():
    facts, _ = facts_of([b'{"generated_text":"hi"}'], content_type="application/json")
    assert facts is not None and facts.output_tokens is None and facts.finish_reasons == ()


def test_stream_counts_tokens_and_takes_details_from_the_last_event():
    for space in ("", " "):
        facts, call = facts_of(tgi_stream(5, eos=True, space=space), request=dict(REQUEST, stream=True))
        assert call.errors == 0
        assert (facts.stream, facts.streamed, facts.output_tokens, facts.input_tokens) == (True, True, 6, 3)
        assert facts.finish_reasons == ("eos_token",)
        # the EOS token (special) is not output: 5 chunks, the first at the first token event
        assert (facts.chunks, facts.first_chunk_ns, facts.last_chunk_ns) == (5, 1000, 1004)


def test_generate_stream_route_needs_no_stream_field():
    facts, _ = facts_of(tgi_stream(3))
    assert facts.stream is True and facts.chunks == 3 and facts.output_tokens == 3


def test_middle_events_are_not_decoded(monkeypatch):
    decoded = []
    real = llm.loads
    monkeypatch.setattr(llm, "loads", lambda data: decoded.append(data) or real(data))
    facts, _ = facts_of(tgi_stream(20))
    assert facts.chunks == 20 and facts.output_tokens == 20
    assert len([d for d in decoded if d.startswith(b"{\"index\"")]) == 2  # the first and the last events only


def test_content_capture_from_the_stream():
    facts, _ = facts_of(tgi_stream(3, eos=True), capture_content=True)
    assert facts.output_text == "t0 t1 t2 " and facts.input_messages == [("user", "hello mock world")]


def test_not_tgi_is_no_call():
    assert facts_of([b'{"ok":true}'], content_type="application/json")[0] is None  # some other POST /
    assert facts_of([b'{"generated_text":"x"}'], request={"foo": 1}, content_type="application/json")[0] is None
    assert facts_of([b"<html></html>"], request=b"a=b", content_type="text/html")[0] is None


def test_error_answer_is_a_call():
    facts, _ = facts_of([b'{"error":"Input validation error","error_type":"validation"}'], content_type="application/json")
    assert facts is not None and facts.output_tokens is None


def test_event_read_from_bytes():
    assert tgi_plain_event(b'{"index":1,"token":{"id":1,"text":"a","special":false},"generated_text":null,"details":null}') == 1
    assert tgi_plain_event(b'{"index":1,"token":{"id":1,"text":"","special":true},"generated_text":null,"details":null}') == 0
    assert tgi_plain_event(b'{"index":1,"token":{"id":1,"text":"a","special":false},"generated_text":"a","details":{}}') == -1
    assert tgi_plain_event(b'{"error":"x","error_type":"generation"}') == -1
    assert tgi_plain_event(b"not json") == -1


@FUZZ
@given(tokens=st.integers(min_value=1, max_value=30), eos=st.booleans(),
       cuts=st.lists(st.integers(min_value=0, max_value=100_000), max_size=10), capture=st.booleans())  # fmt: skip
def test_chunking_never_changes_the_facts(tokens, eos, cuts, capture):
    data = b"".join(tgi_stream(tokens, eos=eos))
    whole, call = facts_of([data], capture_content=capture)
    chunked, call2 = facts_of(split(data, cuts), capture_content=capture)
    assert call.errors == call2.errors == 0
    assert (whole.chunks, whole.output_tokens, whole.input_tokens, whole.finish_reasons, whole.output_text) == (
        chunked.chunks, chunked.output_tokens, chunked.input_tokens, chunked.finish_reasons, chunked.output_text)
    assert whole.chunks == tokens and whole.output_tokens == tokens + eos


@FUZZ
@given(data=st.binary(max_size=400), request=st.one_of(st.binary(max_size=200), st.just(compact(REQUEST).encode())),
       content_type=st.sampled_from([None, "text/event-stream", "application/json"]),
       cuts=st.lists(st.integers(min_value=0, max_value=1000), max_size=6))  # fmt: skip
def test_survives_anything(data, request, content_type, cuts):
    facts, call = facts_of(split(data, cuts), request=request, content_type=content_type)
    assert call.errors == 0
