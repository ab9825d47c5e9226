"""Header fields kept as text (FieldBlock): every lookup answers what the pairs would.

The parser keeps a well-formed head's fields as their text and splits them into
pairs only when a consumer walks them; lookups by name search the text. These tests
hold that to the rule the eager parse applies (``_parse_fields``: names lower-cased,
values stripped, first value wins for ``header()``), on hand-picked and generated heads.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.http1.parse import HeadComplete, HttpParser
from protocols.http1.tests.messages import NGINX_200
from protocols.http1.types import FieldBlock, HttpRequest


def _head(data: bytes, kind: str = "request"):
    parser = HttpParser(kind)
    if kind == "response":
        parser.expect_response_to("GET")
    heads = [e.message for e in parser.feed(data, 1) if isinstance(e, HeadComplete)]
    assert len(heads) == 1
    return parser, heads[0]


def _eager(lines: list[str]) -> tuple[list[tuple[str, str]], int]:
    """The pairs RFC 9112 gives for field lines (an oracle written apart from the
    parser): ``name:value``, name lower-cased, value stripped; a line starting
    with white space continues the previous value; anything else is an error."""
    pairs: list[tuple[str, str]] = []
    errors = 0
    for line in lines:
        name, colon, value = line.partition(":")
        if colon and name and name[0] not in " \t":
            pairs.append((name.lower(), value.strip()))
        elif line[:1] in (" ", "\t") and pairs:
            pairs[-1] = (pairs[-1][0], f"{pairs[-1][1]} {line.strip()}")
        else:
            errors += 1
    return pairs, errors


def test_a_well_formed_head_keeps_its_fields_as_text_that_acts_as_the_pairs():
    parser, message = _head(
        b"GET /v1/x HTTP/1.1\r\nHost:  api.local:8080 \r\nUser-Agent: curl/8\r\nX-Colon: a:b:c\r\n"
        b"TraceParent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\nx-empty:\r\n\r\n"
    )
    fields = message.headers
    assert type(fields) is FieldBlock
    pairs = [
        ("host", "api.local:8080"),
        ("user-agent", "curl/8"),
        ("x-colon", "a:b:c"),
        ("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        ("x-empty", ""),
    ]
    assert fields == pairs and pairs == fields and not (fields != pairs)
    assert list(fields) == pairs and len(fields) == 5 and fields[2] == ("x-colon", "a:b:c") and fields
    assert repr(fields) == repr(pairs)
    assert message.header("host") == "api.local:8080" and message.header("traceparent").startswith("00-")
    assert message.header("x-empty") == "" and message.header("missing") is None
    assert fields.has("user-agent") and not fields.has("user")
    assert parser.parse_errors == 0


def test_a_name_is_only_matched_at_the_start_of_a_line():
    _, message = _head(b"GET / HTTP/1.1\r\nX-Note: not\r\nhost: here\r\nhost: again\r\nReferer: x\r\n\r\n")
    fields = message.headers
    assert fields.get("host") == "here" and fields.get_all("host") == ["here", "again"]
    assert fields.get("note") is None and fields.get("eferer") is None
    # the start line is not a field, even when it looks like one
    _, message = _head(b"GET /host:x HTTP/1.1\r\nA: 1\r\n\r\n")
    assert message.headers.get("get /host") is None and message.header("a") == "1"


def test_framing_is_read_while_the_lines_are_checked():
    _, message = _head(NGINX_200, "response")
    assert type(message.headers) is FieldBlock and message.body_size == int(message.header("content-length"))
    parser, message = _head(b"POST / HTTP/1.1\r\nCONTENT-LENGTH: 3\r\ncontent-length: 3\r\n\r\nabc")
    assert message.headers.content_length == "3,3" and parser.parse_errors == 0
    parser = HttpParser("request")
    events = parser.feed(b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 1)
    assert parser.parse_errors == 1 and not any(isinstance(e, HeadComplete) for e in events)
    _, message = _head(b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
    assert message.headers.transfer_coding == "gzip, Chunked" and message.body == b"abc"


def test_a_head_with_a_bad_or_folded_line_is_parsed_into_pairs_and_counted():
    parser, message = _head(b"GET / HTTP/1.1\r\nHost: a\r\n  folded\r\nno colon here\r\n\r\n")
    assert type(message.headers) is list
    assert message.headers == [("host", "a folded")] and parser.parse_errors == 1


def test_fields_set_by_hand_stay_a_list():
    request = HttpRequest(headers=[("host", "h")])
    assert request.header("host") == "h" and type(request.headers) is list


_NAME = st.text(alphabet=st.sampled_from("aAbBcCxX-hHoOsStT:"), min_size=1, max_size=16)
_VALUE = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=255, exclude_characters="\r\n"), max_size=20)
_LINE = st.one_of(
    st.tuples(_NAME, _VALUE).map(lambda nv: f"{nv[0]}:{nv[1]}"),
    st.sampled_from(["Host: h", "HOST:h2", "Content-Length: 0", "content-length:0", " folded", "bare", ":x", "\tx"]),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_LINE, min_size=1, max_size=8))
def test_lookups_and_pairs_agree_with_the_eager_parse(lines: list[str]):
    """Whatever the lines, the message's fields equal the eager parse, and each name's
    first value is what header() returns."""
    head = "GET / HTTP/1.1\r\n" + "\r\n".join(lines) + "\r\n\r\n"
    parser = HttpParser("request")
    events = parser.feed(head.encode("latin-1"), 1)
    heads = [e.message for e in events if isinstance(e, HeadComplete)]
    if not heads:  # framing refused the request (a bad content-length): nothing to compare
        assert parser.parse_errors >= 1
        return
    message = heads[0]
    expected, errors = _eager(lines)
    assert list(message.headers) == expected
    assert parser.parse_errors == errors
    probes = {name for name, _ in expected} | {"host", "content-length", "x", "hh", "b3", "traceparent", "a-b-c"}
    fields = message.headers
    for name in probes:
        first = next((value for key, value in expected if key == name), None)
        assert message.header(name) == first
        if type(fields) is FieldBlock:  # every lookup by name agrees with the pairs
            every = [value for key, value in expected if key == name]
            assert fields.get_all(name) == every and fields.has(name) == bool(every)
    if type(fields) is FieldBlock:
        names = tuple(sorted(probes))
        assert fields.has_any(names) == any(key in probes for key, _ in expected)
        assert fields.has_any(("traceparent", "b3")) == any(key in ("traceparent", "b3") for key, _ in expected)
