"""Capture gaps in LLM streams (SseParser.gap, LlmCall with holes) and the cheap per-chunk
path (chunks counted from their bytes, decoded only where they may carry usage or a
finish reason): the facts are the same as decoding every chunk."""

from __future__ import annotations

import json

import hypothesis.strategies as st
from hypothesis import given, settings

from protocols.genai import LlmCall, SseParser, match_endpoint
from protocols.genai.chunks import ollama_plain_line, openai_plain_chunk

CHAT = match_endpoint("POST", "/v1/chat/completions")
REQUEST = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()


def openai_stream(tokens: int, separators=(", ", ": ")) -> list[bytes]:
    dumps = lambda o: json.dumps(o, separators=separators)  # noqa: E731
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m-served"}
    out = [dumps({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})]
    out += [dumps({**base, "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "logprobs": None, "finish_reason": None}]})
            for i in range(tokens)]  # fmt: skip
    out.append(dumps({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}))
    out.append(dumps({**base, "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": tokens}}))
    out.append("[DONE]")
    return [f"data: {e}\n\n".encode() for e in out]


def facts_of(pieces: list[bytes | None], capture_content=False):
    call = LlmCall(CHAT, capture_content)
    call.request_body(REQUEST)
    call.response_start("text/event-stream")
    for ts, piece in enumerate(pieces, 1):
        call.response_body(ts, piece)
    return call.finish(), call


def test_cheap_path_gives_the_same_facts_as_decoding_every_chunk():
    for separators in ((", ", ": "), (",", ":")):
        events = openai_stream(50, separators)
        cheap, _ = facts_of([b"".join(events)])
        full, _ = facts_of([b"".join(events)], capture_content=True)  # content capture decodes every chunk
        assert (cheap.chunks, cheap.input_tokens, cheap.output_tokens, cheap.finish_reasons, cheap.response_id) == (
            50, 7, 50, ("length",), "chatcmpl-1")
        assert (full.chunks, full.input_tokens, full.output_tokens, full.finish_reasons) == (50, 7, 50, ("length",))


def test_plain_chunk_reader_sends_anything_unusual_to_the_decoder():
    assert openai_plain_chunk(b'{"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": null}]}') == 1
    assert openai_plain_chunk(b'{"choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}') == 0
    assert openai_plain_chunk(b'{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}') == -1
    assert openai_plain_chunk(b'{"choices":[],"usage":{"prompt_tokens":1}}') == -1
    assert openai_plain_chunk(b'{"choices":[{"index":0},{"index":1}]}') == -1
    assert openai_plain_chunk(b'{"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}') == -1
    assert openai_plain_chunk(b'{"choices":[{"delta":{"content":"say \\"usage\\": 1"}}]}') == 1
    assert ollama_plain_line(b'{"model":"m","message":{"role":"assistant","content":"x"},"done":false}') == 1
    assert ollama_plain_line(b'{"model":"m","done":true,"eval_count":3}') == -1


def test_a_hole_mid_event_drops_that_event_and_keeps_the_usage():
    events = openai_stream(20)
    stream = b"".join(events)
    cut = stream.index(events[5]) + 20
    resume = stream.index(events[9]) + 7  # mid-line: skipped up to the next blank line
    facts, call = facts_of([stream[:cut], None, stream[resume:]])
    assert (facts.input_tokens, facts.output_tokens, facts.finish_reasons) == (7, 20, ("length",))
    assert facts.gaps == 1 and facts.chunks == 20 - 5  # t4 (cut), t5..t8 (lost, t8 dropped) not counted


def test_a_hole_that_ends_at_an_event_start_resumes_there():
    events = openai_stream(10)
    stream = b"".join(events)
    facts, _ = facts_of([stream[: stream.index(events[3]) + 4], None, stream[stream.index(events[6]) :]])
    assert facts.chunks == 2 + 5 and facts.output_tokens == 10  # t0, t1 before; t5..t9 after


def test_sse_gap_never_joins_bytes_across_the_hole():
    parser = SseParser()
    assert parser.feed(b"data: first half") == []
    parser.gap()
    got = parser.feed(b" of another line\n\ndata: next\n\n")
    assert [e.data for e in got] == [b"next"] and parser.gaps == 1


@settings(max_examples=200, deadline=None)
@given(holes=st.lists(st.tuples(st.integers(0, 4000), st.integers(1, 600)), max_size=5), split=st.integers(1, 500))
def test_holes_anywhere_before_the_last_chunks_keep_usage_and_finish(holes, split):
    events = openai_stream(60)
    stream = b"".join(events)
    keep_from = stream.index(events[-3])  # the finish chunk, the usage chunk and [DONE] are captured
    pieces, pos = [], 0
    for at, length in sorted(holes):
        if at < pos or at + length >= keep_from - 1:
            continue
        pieces += [stream[i : min(i + split, at)] for i in range(pos, at, split)] + [None]
        pos = at + length
    pieces += [stream[i : i + split] for i in range(pos, len(stream), split)]
    facts, call = facts_of(pieces)
    assert call.errors == 0
    assert (facts.input_tokens, facts.output_tokens, facts.finish_reasons) == (7, 60, ("length",))
    assert facts.chunks <= 60
