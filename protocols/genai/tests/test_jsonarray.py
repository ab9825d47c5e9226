"""A JSON array streamed element by element (protocols/genai/jsonarray.py): each element once,
whatever the piece boundaries, strings and escapes followed; bounded; never raising."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from protocols.genai.jsonarray import JsonArrayStream
from protocols.genai.tests.test_fuzz import FUZZ, split

ELEMENTS = [{"a": 'quote " and brace } and bracket ] in a string', "n": [1, {"b": []}]}, {"c": "\\"}, [1, 2], {"d": "é"}]
ARRAY = ("[" + "\n,\r\n".join(json.dumps(e) for e in ELEMENTS) + "\n]").encode()


def decode(pieces, **kwargs):
    stream = JsonArrayStream(**kwargs)
    out = []
    for piece in pieces:
        if piece is None:
            stream.gap()
        else:
            out += stream.feed(piece)
    return out, stream


def test_elements_as_written():
    events, stream = decode([ARRAY])
    assert [json.loads(e.data) for e in events] == ELEMENTS and stream.errors == 0


def test_scalars_are_skipped_and_not_an_array_is_counted():
    events, stream = decode([b' [1, 2.5, true, {"x": 1}, null]'])
    assert [e.data for e in events] == [b'{"x": 1}'] and stream.errors == 0
    events, stream = decode([b'{"x": 1}'])
    assert events == [] and stream.errors == 1


def test_a_hole_resumes_at_the_next_element():
    cut = ARRAY.index(b"\n,\r\n")  # inside the first element
    events, stream = decode([ARRAY[: cut - 5], None, ARRAY[cut - 2 :]])
    assert [json.loads(e.data) for e in events] == ELEMENTS[1:] and stream.gaps == 1


def test_a_long_element_keeps_its_head_and_tail():
    events, _ = decode([ARRAY], limit=10, tail=6)
    assert events[0].truncated and events[0].data == ARRAY[1:11] and events[0].tail == json.dumps(ELEMENTS[0]).encode()[-6:]


@FUZZ
@given(cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=20))
def test_chunking_never_changes_the_elements(cuts):
    assert decode(split(ARRAY, cuts))[0] == decode([ARRAY])[0]


@FUZZ
@given(data=st.lists(st.one_of(st.binary(max_size=30), st.sampled_from([b"[", b"]", b"{", b"}", b'"', b"\\", b",", ARRAY])),
                     max_size=20).map(b"".join),
       cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=10), gap=st.booleans())  # fmt: skip
def test_survives_anything_within_bounds(data, cuts, gap):
    stream = JsonArrayStream(limit=40, tail=8)
    for i, piece in enumerate(split(data, cuts)):
        for event in stream.feed(piece):
            assert len(event.data) <= 40 and len(event.tail) <= 8
        assert stream.buffered <= 40 + 8 + 64
        if gap and i == 0:
            stream.gap()
