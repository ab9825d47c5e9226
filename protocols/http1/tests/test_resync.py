"""Chunked bodies whose pieces are read (body_events: an LLM call's SSE stream) resume
at the next trustworthy chunk boundary after a capture gap or lost framing, instead of
ending the message: the bytes after the gap (the stream's last chunk, with its usage)
are still read, the hole is reported (BodyData with data None) and the message marked
truncated."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from protocols.http1.parse import BodyData, HeadComplete, HttpParser, MessageComplete

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


EVENTS = [b'data: {"n": %d, "choices": [{"delta": {"content": "t%d"}}]}\n\n' % (i, i) for i in range(40)]
LAST = b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 40}}\n\n'
BODY = b"".join(chunk(e) for e in EVENTS) + chunk(LAST) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
STREAM = HEAD + BODY


def run(pieces: list[tuple[bytes, int]]) -> tuple[list, HttpParser]:
    parser = HttpParser("response")
    events = []
    for ts, (data, missing) in enumerate(pieces, 1):
        events += parser.feed(data, ts, missing)
    return events, parser


def body_and_holes(events) -> tuple[bytes, int, list]:
    body, holes, done = b"", 0, []
    for event in events:
        if type(event) is BodyData:
            if event.data is None:
                holes += 1
            else:
                body += event.data
        elif type(event) is MessageComplete:
            done.append(event.message)
    return body, holes, done


def test_a_read_cut_to_the_capture_size_resumes_at_the_next_chunk():
    """The kernel kept the first 300 bytes of a 2000-byte read: the rest of that read is
    lost, the next read is parsed from its first chunk boundary on."""
    start = len(HEAD) + 100
    read1 = STREAM[: start + 300]
    lost = STREAM[start + 300 : start + 2000]
    events, parser = run([(read1, len(lost)), (STREAM[start + 2000 :], 0)])
    body, holes, [message] = body_and_holes(events)
    assert holes == 1 and message.complete and message.body_truncated
    assert body.endswith(LAST + b"data: [DONE]\n\n") and parser.parse_errors == 0 and parser.resyncs == 1


def test_a_gap_that_ends_at_a_chunk_start_resumes_there():
    cut = len(HEAD) + len(chunk(EVENTS[0]))  # the next read begins with a chunk-size line
    first = STREAM[: len(HEAD) + 5]
    events, parser = run([(first, cut - len(first)), (STREAM[cut:], 0)])
    body, holes, [message] = body_and_holes(events)
    assert holes == 1 and message.complete and body.endswith(EVENTS[1] + b"".join(EVENTS[2:]) + LAST + b"data: [DONE]\n\n")


def test_lost_records_show_as_garbage_framing_and_resync_too():
    """A ring-buffer loss is not reported per connection: the parser sees a chunk-size
    line that is not one (the middle of some chunk): it resyncs without a parse error."""
    cut1 = len(HEAD) + 500
    cut2 = len(HEAD) + 1500
    events, parser = run([(STREAM[:cut1], 0), (STREAM[cut2:], 0)])
    body, holes, [message] = body_and_holes(events)
    assert message.complete and message.body_truncated and holes == 1
    assert body.endswith(LAST + b"data: [DONE]\n\n")


def test_a_boundary_straddling_two_reads_is_found():
    cut1 = len(HEAD) + 500
    boundary = STREAM.index(b"\r\n" + b"%x" % len(EVENTS[20]) + b"\r\n", len(HEAD) + 1500)
    # the second read holds no boundary of its own: only the one it ends inside of
    events, parser = run([(STREAM[:cut1], boundary - 30 - cut1), (STREAM[boundary - 30 : boundary + 3], 0), (STREAM[boundary + 3 :], 0)])
    body, holes, [message] = body_and_holes(events)
    size_line = b"\r\n%x\r\n" % len(EVENTS[20])
    resumed = STREAM[boundary + len(size_line) : boundary + len(size_line) + len(EVENTS[20])]  # the chunk after it
    assert message.complete and body.endswith(LAST + b"data: [DONE]\n\n")
    assert resumed in body and parser.resyncs == 1


def test_without_body_events_lost_framing_still_ends_the_message():
    parser = HttpParser("response", body_events=False)
    events = parser.feed(STREAM[: len(HEAD) + 100], 1, 1000)
    assert [type(e) for e in events] == [HeadComplete, MessageComplete]
    assert parser.parse_errors == 1 and parser.resyncs == 0


@settings(max_examples=300, deadline=None)
@given(cuts=st.lists(st.tuples(st.integers(0, len(BODY)), st.integers(0, 3000), st.booleans()), max_size=6))
def test_any_gaps_still_read_the_last_chunk_when_it_was_captured(cuts):
    """Gaps anywhere: the parser never raises and ends the message once. Reported gaps
    (missing bytes: a cut capture) that leave the last chunks captured keep the usage
    event whole. A silent loss (lost records) is noticed only where framing breaks,
    possibly after the bytes on both sides of it were taken as one chunk's data."""
    tail_start = len(HEAD) + BODY.index(chunk(LAST)) - 2  # the CRLF before the usage chunk's size line
    pieces, pos = [], 0
    for at, length, reported in sorted(cuts):
        at = len(HEAD) + at
        if at < pos or at + length >= tail_start:
            continue
        pieces.append((STREAM[pos:at], length if reported else 0))
        pos = at + length
    pieces.append((STREAM[pos:], 0))
    events, parser = run(pieces)
    events += parser.close()
    body, holes, done = body_and_holes(events)
    assert len(done) == 1
    if all(missing or not data for data, missing in pieces[:-1]) and all(missing for _, missing in pieces[:-1]):
        assert done[0].complete and body.endswith(LAST + b"data: [DONE]\n\n")
