"""The SSE parser and line splitter: the spec's cases, bounds, and chunking."""

from __future__ import annotations

from protocols.genai.sse import LineSplitter, SseEvent, SseParser


def parse(*chunks: bytes, **kwargs) -> list[SseEvent]:
    parser = SseParser(**kwargs)
    out: list[SseEvent] = []
    for chunk in chunks:
        out += parser.feed(chunk)
    return out


def test_openai_style_stream() -> None:
    stream = b'data: {"a":1}\n\ndata: {"a":2}\n\ndata: [DONE]\n\n'
    assert [e.data for e in parse(stream)] == [b'{"a":1}', b'{"a":2}', b"[DONE]"]


def test_crlf_cr_and_lf_line_ends_and_multi_line_data() -> None:
    stream = b"data: one\r\ndata: two\r\n\r\ndata:three\r\rdata: four\n\n"
    assert [e.data for e in parse(stream)] == [b"one\ntwo", b"three", b"four"]


def test_a_crlf_split_between_chunks_is_one_line_end() -> None:
    assert [e.data for e in parse(b"data: x\r", b"\n\r", b"\ndata: y\n\n")] == [b"x", b"y"]


def test_comments_event_names_and_other_fields() -> None:
    parser = SseParser()
    events = parser.feed(b": ping\n\nevent: response.output_text.delta\nid: 7\nretry: 10\ndata: {}\n\n")
    assert events == [SseEvent(b"{}", "response.output_text.delta")]
    assert parser.comments == 1


def test_a_blank_line_without_data_dispatches_nothing_and_the_name_is_reset() -> None:
    assert parse(b"event: x\n\n\n\ndata: d\n\n") == [SseEvent(b"d", "")]


def test_an_unterminated_event_is_not_dispatched() -> None:
    assert parse(b"data: partial") == []


def test_an_event_over_the_bound_is_cut_and_marked() -> None:
    [event] = parse(b"data: " + b"x" * 100 + b"\n\n", max_event=10)
    assert event.data == b"x" * 10 and event.truncated


def test_a_line_over_the_bound_is_cut_and_marked_and_memory_stays_bounded() -> None:
    parser = SseParser(max_event=64, max_line=32, tail=16)
    for _ in range(1000):
        parser.feed(b"data: " + b"y" * 1000)
        assert parser.buffered <= 64 + 2 * (32 + 16)
    [event] = parser.feed(b"\n\n")
    assert event.truncated and event.data == b"y" * 26


def test_line_splitter_pending_and_bounds() -> None:
    splitter = LineSplitter(max_line=4)
    assert splitter.feed(b"ab\ncdefgh\nij") == [(b"ab", None), (b"cdef", b"gh")]
    assert splitter.pending() == (b"ij", None)


def test_a_cut_line_keeps_its_true_end_whatever_the_chunking() -> None:
    line = b"data: " + bytes(65 + i % 26 for i in range(2560)) + b"\n"
    for size in (1, 7, 100, len(line)):
        splitter = LineSplitter(max_line=50, tail=30)
        got = []
        for start in range(0, len(line), size):
            got += splitter.feed(line[start : start + size])
        assert got == [(line[:50], line[-31:-1])]


def test_a_truncated_event_carries_the_end_of_its_data() -> None:
    payload = b'{"choices": [], "pad": "' + b"p" * 500 + b'", "usage": {"prompt_tokens": 1}}'
    [event] = parse(b"data: " + payload + b"\n\n", max_event=100, max_line=80, tail=40)
    assert event.truncated and event.data == payload[:74] and event.tail == payload[-40:]
