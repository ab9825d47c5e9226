"""The direct encoders write exactly what the message-building encoder did.

``serialize_request`` (protobuf wire bytes written by hand) and
``encode_json_line`` (OTLP/JSON written straight from the records) replaced
filling ``opentelemetry.proto`` messages and walking them. The reference
here is the original ``encode_request``, kept verbatim below (it builds the
request message span by span), and the original JSON writer,
``to_otlp_json``, applied to its result. For random batches - well-typed
spans and every kind of odd field the encoder promises to survive - the new
bytes must equal the reference's serialization byte for byte, and the JSON
line must equal the reference's line character for character.
"""

from __future__ import annotations

import enum
import math
import threading
from typing import Any, Mapping

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans

import otelbpf
from otelbpf.core.model import ResourceLookup, SpanKind, SpanLink, SpanRecord, StatusCode
from otelbpf.export import SpanBatch, encode_request, from_otlp_json, jsonfile as jsonfile_module, to_otlp_json
from otelbpf.export.encode import _encode_request_via_messages, _fill_span, _fill_span_defensively, serialize_request
from otelbpf.export.jsonfile import _json_key_value, encode_json_line
from otelbpf.otlp import wire as wire_module
from otelbpf.otlp.wire import (
    FragmentCache as _FragmentCache,
    fill_attributes_safely as _fill_attributes_safely,
    text as _text,
    wire_key_value as _wire_key_value,
)

# --- the reference: encode_request as it was before the wire encoder ---------


def original_encode_request(spans: list[SpanRecord], resources: ResourceLookup) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    groups: dict[int, _ResourceGroup] = {}
    for span in spans:
        group = groups.get(span.pid)
        if group is None:
            group = groups[span.pid] = _ResourceGroup(request, resources, span.pid)
        scope_spans = group.scope_spans(span.scope)
        try:
            _fill_span(scope_spans.spans.add(), span)
        except Exception:  # noqa: BLE001
            del scope_spans.spans[-1]
            _fill_span_defensively(scope_spans.spans.add(), span)
    return request


class _ResourceGroup:
    def __init__(self, request: ExportTraceServiceRequest, resources: ResourceLookup, pid: int) -> None:
        self.resource_spans: ResourceSpans = request.resource_spans.add()
        try:
            attributes = resources.attributes(pid)
        except Exception:  # noqa: BLE001
            attributes = None
        if attributes is not None:
            _fill_attributes_safely(self.resource_spans.resource.attributes, attributes)
        self.by_scope: dict[str, ScopeSpans] = {}

    def scope_spans(self, scope: str) -> ScopeSpans:
        scope_spans = self.by_scope.get(scope)
        if scope_spans is None:
            scope_spans = self.by_scope[scope] = self.resource_spans.scope_spans.add()
            scope_spans.scope.name = _text(scope)
            scope_spans.scope.version = otelbpf.__version__
        return scope_spans


def reference_json_line(spans: list[SpanRecord], resources: ResourceLookup) -> bytes:
    return (to_otlp_json(original_encode_request(spans, resources)) + "\n").encode("utf-8")


# --- random spans: mostly well typed, with every odd field the encoder survives --


class Resources(ResourceLookup):
    def __init__(self, by_pid: Mapping[int, Any], broken: frozenset[int] = frozenset()) -> None:
        self.by_pid = by_pid
        self.broken = broken

    def attributes(self, pid: int) -> Any:
        if pid in self.broken:
            raise KeyError(pid)
        return self.by_pid.get(pid, {})


class Color(enum.IntEnum):
    RED = 1


SURROGATE = "caf\udce9"  # what surrogateescape decoding leaves for bytes that were not UTF-8
texts = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", "GET", "/v1/chat", "ünï", "<a&b>", "line\u2028sep\u2029", 'q"uote\\', "\x00\x1f", "😀"]),
    st.text(min_size=120, max_size=300),  # lengths that need two-byte varints
)
odd_texts = st.one_of(st.just(SURROGATE), st.builds(lambda a, b: a + "\ud800" + b, st.text(max_size=3), st.text(max_size=3)))
keys = st.one_of(
    st.sampled_from(["http.request.method", "url.path", "server.port", "flag", "ratio", "k", ""]),
    texts,
)
good_values = st.one_of(
    texts,
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([0, 1, -1, 127, 128, 200, 2**63 - 1, -(2**63)]),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.0, 1.5, 1e21, 1e-7, math.nan, math.inf, -math.inf]),
)
odd_values = st.one_of(
    st.none(),
    odd_texts,
    st.integers(min_value=2**63, max_value=2**70),
    st.integers(min_value=-(2**70), max_value=-(2**63) - 1),
    st.just(Color.RED),
    st.just(StatusCode.ERROR),
    st.binary(max_size=4),
    st.lists(st.one_of(st.text(max_size=3), st.integers(-5, 5), st.none()), max_size=3),
    st.builds(object),
)
good_attributes = st.dictionaries(keys, good_values, max_size=20)
any_attributes = st.one_of(
    good_attributes,
    st.dictionaries(st.one_of(keys, odd_texts, st.integers(0, 9)), st.one_of(good_values, odd_values), max_size=8),
)
trace_ids = st.one_of(st.binary(min_size=16, max_size=16), st.binary(min_size=16, max_size=16), st.binary(max_size=20))
span_ids = st.one_of(st.binary(min_size=8, max_size=8), st.binary(min_size=8, max_size=8), st.binary(max_size=10))
good_links = st.builds(
    SpanLink,
    trace_id=st.binary(min_size=16, max_size=16),
    span_id=st.binary(min_size=8, max_size=8),
    attributes=good_attributes,
)
odd_links = st.builds(
    SpanLink,
    trace_id=st.one_of(trace_ids, st.just("0" * 16), st.builds(bytearray, st.binary(min_size=16, max_size=16))),
    span_id=span_ids,
    attributes=any_attributes,
)
times = st.one_of(
    st.integers(1, 2**64 - 1),
    st.integers(1_700_000_000_000_000_000, 1_800_000_000_000_000_000),
    st.just(0),
)
odd_times = st.one_of(times, st.integers(-(2**64), -1), st.integers(2**64, 2**66), st.just(1.5), st.just(True))


@st.composite
def span_records(draw: st.DrawFn) -> SpanRecord:
    """Four in five well typed throughout (the fast path's), else odd fields anywhere (the message path's)."""
    odd = draw(st.integers(0, 4)) == 0
    return SpanRecord(
        trace_id=draw(trace_ids if odd else st.binary(min_size=16, max_size=16)),
        span_id=draw(span_ids if odd else st.binary(min_size=8, max_size=8)),
        parent_span_id=draw(st.one_of(st.just(b""), st.binary(min_size=8, max_size=8), *([span_ids] if odd else []))),
        name=draw(st.one_of(texts, odd_texts, st.none(), st.just(7)) if odd else texts),
        kind=draw(st.one_of(st.sampled_from(SpanKind), st.integers(-1, 7), st.just(True)) if odd else st.sampled_from(SpanKind)),
        start_ns=draw(odd_times if odd else times),
        end_ns=draw(odd_times if odd else times),
        pid=draw(st.sampled_from([1, 2, 3])),
        attributes=draw(any_attributes if odd else good_attributes),
        status_code=draw(st.one_of(st.sampled_from(StatusCode), st.integers(0, 3)) if odd else st.sampled_from(StatusCode)),
        status_message=draw(st.one_of(texts, odd_texts, st.none()) if odd else texts),
        trace_state=draw(st.one_of(st.just(""), texts, *([odd_texts] if odd else []))),
        links=draw(st.lists(st.one_of(good_links, odd_links) if odd else good_links, max_size=3)),
        scope=draw(st.one_of(st.sampled_from(["otelbpf", "otelbpf.http", ""]), texts, *([odd_texts] if odd else []))),
    )


resource_lookups = st.builds(
    Resources,
    st.dictionaries(st.sampled_from([1, 2, 3]), any_attributes, max_size=3),
    st.frozensets(st.sampled_from([1, 2, 3]), max_size=1),
)

# --- the properties ------------------------------------------------------------

CHECKS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@CHECKS
@given(st.lists(span_records(), max_size=8), resource_lookups)
def test_wire_bytes_equal_the_message_encoders_serialization(spans: list[SpanRecord], resources: Resources) -> None:
    expected = original_encode_request(spans, resources).SerializeToString()

    assert serialize_request(spans, resources) == expected
    assert encode_request(spans, resources).SerializeToString() == expected
    assert _encode_request_via_messages(spans, resources).SerializeToString() == expected


@CHECKS
@given(st.lists(span_records(), max_size=8), resource_lookups)
def test_json_line_equals_the_line_written_from_the_message(spans: list[SpanRecord], resources: Resources) -> None:
    assert encode_json_line(spans, resources) == reference_json_line(spans, resources)


@settings(max_examples=100, deadline=None)
@given(st.lists(span_records(), min_size=1, max_size=4), resource_lookups)
def test_json_line_reads_back_to_the_encoded_request(spans: list[SpanRecord], resources: Resources) -> None:
    line = encode_json_line(spans, resources).decode("utf-8")

    parsed = from_otlp_json(line)

    # Compared as what each writes: equal except that -0.0 is written (as before) as 0, and NaN != NaN.
    assert to_otlp_json(parsed) + "\n" == line
    assert len(parsed.resource_spans) == len(encode_request(spans, resources).resource_spans)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(span_records(), max_size=4), min_size=2, max_size=5), resources=resource_lookups)
def test_tiny_caches_that_overflow_and_reset_change_nothing(
    monkeypatch_caches: None, batches: list[list[SpanRecord]], resources: Resources
) -> None:
    """Shared by all examples on purpose: values of earlier examples are what overflows them."""
    for spans in batches:
        assert serialize_request(spans, resources) == original_encode_request(spans, resources).SerializeToString()
        assert encode_json_line(spans, resources) == reference_json_line(spans, resources)


@pytest.fixture
def monkeypatch_caches() -> Any:
    """Caches of 2 values per key and 5 in all, so the hypothesis examples keep overflowing them."""
    saved = wire_module.WIRE_CACHE, jsonfile_module._JSON_CACHE
    wire_module.WIRE_CACHE = _FragmentCache(_wire_key_value, per_key=2, total=5, max_len=8)
    jsonfile_module._JSON_CACHE = _FragmentCache(_json_key_value, per_key=2, total=5, max_len=8)
    yield
    wire_module.WIRE_CACHE, jsonfile_module._JSON_CACHE = saved


# --- examples worth naming ------------------------------------------------------


def typical_span(number: int, **overrides: Any) -> SpanRecord:
    fields: dict[str, Any] = dict(
        trace_id=number.to_bytes(16, "big"),
        span_id=(number + 1).to_bytes(8, "big"),
        name="GET /api/items/{id}",
        kind=SpanKind.SERVER,
        start_ns=1_763_800_000_000_000_000 + number,
        end_ns=1_763_800_000_000_500_000 + number,
        pid=1 + number % 2,
        scope="otelbpf.http",
        attributes={
            "http.request.method": "GET",
            "url.path": f"/api/items/{number}",
            "server.port": 8080,
            "network.peer.port": 40_000 + number,
            "user_agent.original": "wrk/4.2.0",
            "http.response.status_code": 200,
        },
    )
    fields.update(overrides)
    return SpanRecord(**fields)


RESOURCES = Resources({1: {"service.name": "nginx", "process.pid": 1}, 2: {"service.name": "api", "process.pid": 2}})


def test_same_key_with_equal_values_of_different_types_keeps_each_type() -> None:
    """True == 1 == 1.0 (same hash too): a cached int must never be written for a bool or a float."""
    spans = [typical_span(0, attributes={"k": value}) for value in (1, True, 1.0, 1, "1", Color.RED, 1.0, True)]

    for _ in range(2):  # cold, then with every value cached
        assert serialize_request(spans, RESOURCES) == original_encode_request(spans, RESOURCES).SerializeToString()
        assert encode_json_line(spans, RESOURCES) == reference_json_line(spans, RESOURCES)
    written = [s.attributes[0].value.WhichOneof("value") for s in encode_request(spans, RESOURCES).resource_spans[0].scope_spans[0].spans]
    assert written == ["int_value", "bool_value", "double_value", "int_value", "string_value", "int_value", "double_value", "bool_value"]


def test_a_span_with_a_bad_string_is_coerced_and_the_rest_of_the_batch_is_untouched() -> None:
    spans = [typical_span(0), typical_span(1, name=SURROGATE), typical_span(2, attributes={"ua": SURROGATE})]

    request = encode_request(spans, RESOURCES)
    line = encode_json_line(spans, RESOURCES)

    assert request.SerializeToString() == original_encode_request(spans, RESOURCES).SerializeToString()
    assert line == reference_json_line(spans, RESOURCES)
    names = [s.name for rs in request.resource_spans for s in rs.scope_spans[0].spans]
    assert "caf\ufffd" in names and "GET /api/items/{id}" in names


def test_a_batch_of_typical_spans_is_byte_identical_and_shares_one_payload() -> None:
    spans = [typical_span(number) for number in range(300)]
    batch = SpanBatch(spans, RESOURCES)

    assert batch.payload is batch.payload
    assert batch.payload == original_encode_request(spans, RESOURCES).SerializeToString()
    assert batch.request == original_encode_request(spans, RESOURCES)
    assert encode_json_line(spans, RESOURCES) == reference_json_line(spans, RESOURCES)


def test_spans_of_two_kilobytes_and_more_get_multi_byte_lengths() -> None:
    spans = [typical_span(0, name="n" * 5000, attributes={"big": "v" * 20_000, "k" * 300: 1})]

    assert serialize_request(spans, RESOURCES) == original_encode_request(spans, RESOURCES).SerializeToString()
    assert encode_json_line(spans, RESOURCES) == reference_json_line(spans, RESOURCES)


def test_threads_encoding_at_once_share_the_caches_safely() -> None:
    batches = [[typical_span(number * 50 + i) for i in range(50)] for number in range(8)]
    expected = [(original_encode_request(b, RESOURCES).SerializeToString(), reference_json_line(b, RESOURCES)) for b in batches]
    results: dict[int, list[tuple[bytes, bytes]]] = {}

    def work(index: int) -> None:
        results[index] = [(serialize_request(b, RESOURCES), encode_json_line(b, RESOURCES)) for b in batches * 5]

    threads = [threading.Thread(target=work, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert all(result == expected * 5 for result in results.values())


def test_the_caches_stay_bounded() -> None:
    cache = _FragmentCache(_wire_key_value, per_key=4, total=10, max_len=5)
    for number in range(100):
        cache.miss("port", number)
        cache.miss(f"key{number}", "v")
    cache.miss("long", "x" * 6)

    entries = sum(len(values) for table in (cache.strings, cache.ints) for values in table.values())
    assert entries <= 10
    assert all(len(values) <= 4 for table in (cache.strings, cache.ints) for values in table.values())
    assert "long" not in cache.strings
