"""Property tests: any bytes are survived, chunking never changes a result, memory stays bounded."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols.genai import match_endpoint
from protocols.genai.llm import LlmCall
from protocols.genai.sse import LineSplitter, SseParser

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_CHUNK = json.dumps(
    {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": "tok"}, "finish_reason": None}]}
).encode()
_USAGE = json.dumps({"id": "c1", "model": "m", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}).encode()
_FRAGMENTS = [
    b"data: ", _CHUNK, _USAGE, b"\n", b"\r\n", b"\r", b"\n\n", b"data: [DONE]\n\n", b": ping\n", b"event: x\n",
    b'{"model":', b'"usage":{"prompt_tokens":1}', b"\x00\xff", b"{", b"}", b"data:" + b"z" * 300,
]  # fmt: skip
streams = st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.binary(max_size=40)), max_size=30).map(b"".join)
ENDPOINTS = [
    match_endpoint("POST", "/v1/chat/completions"),
    match_endpoint("POST", "/v1/embeddings"),
    match_endpoint("POST", "/v1/responses"),
    match_endpoint("POST", "/api/chat"),
]


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, start = [], 0
    for point in points + [len(data)]:
        pieces.append(data[start:point])
        start = point
    return pieces


@FUZZ
@given(data=streams, cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_sse_chunking_never_changes_the_events(data, cuts) -> None:
    whole = SseParser(max_event=128, max_line=96, tail=20).feed(data)
    parser = SseParser(max_event=128, max_line=96, tail=20)
    pieces = []
    for piece in split(data, cuts):
        pieces += parser.feed(piece)
        assert parser.buffered <= 128 + 2 * (96 + 20)
    assert pieces == whole


@FUZZ
@given(data=streams, cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_line_splitting_is_chunking_independent(data, cuts) -> None:
    whole = LineSplitter(max_line=50, tail=10)
    expected = whole.feed(data)
    splitter = LineSplitter(max_line=50, tail=10)
    got = []
    for piece in split(data, cuts):
        got += splitter.feed(piece)
    assert got == expected and splitter.pending() == whole.pending()


def run_call(endpoint, request: bytes, content_type, pieces: list[bytes], capture: bool):
    call = LlmCall(endpoint, capture_content=capture, request_limit=256, response_limit=256, content_limit=64)
    call.request_body(request)
    call.response_start(content_type)
    for ts, piece in enumerate(pieces):
        call.response_body(ts, piece)
        assert call.buffered <= 256 * 2 + 2 * 16 * 1024 + 64 * 1024 * 2
    facts = call.finish()
    assert call.errors == 0
    return facts


@FUZZ
@given(
    endpoint=st.sampled_from(ENDPOINTS),
    request=st.one_of(st.binary(max_size=300), st.just(b'{"model":"m","stream":true,"max_tokens":3}')),
    content_type=st.sampled_from([None, "text/event-stream", "application/json", "application/x-ndjson", "text/html"]),
    data=streams,
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=8),
    capture=st.booleans(),
)
def test_the_extractor_survives_anything_and_chunking_never_changes_its_facts(endpoint, request, content_type, data, cuts, capture) -> None:
    whole = run_call(endpoint, request, content_type, [data], capture)
    chunked = run_call(endpoint, request, content_type, split(data, cuts), capture)
    if whole is None:
        assert chunked is None
        return
    # Chunk times differ by construction (each piece has its own time); everything else is equal.
    assert (whole.chunks, whole.input_tokens, whole.output_tokens, whole.finish_reasons, whole.response_model) == (
        chunked.chunks, chunked.input_tokens, chunked.output_tokens, chunked.finish_reasons, chunked.response_model,
    )  # fmt: skip
    assert (whole.output_text, whole.input_messages) == (chunked.output_text, chunked.input_messages)
