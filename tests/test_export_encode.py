"""encode_request: every field, typed attributes, grouping; and SpanBatch's shared encoding."""

from __future__ import annotations

from typing import Any, Mapping

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

import otelbpf
from otelbpf.core.model import ResourceLookup, SpanKind, SpanLink, SpanRecord, StatusCode
from otelbpf.export import SpanBatch, encode_request
from otelbpf.export.encode import serialize_request

TRACE_ID = bytes(range(1, 17))
SPAN_ID = bytes(range(17, 25))
PARENT_ID = bytes(range(25, 33))


class StaticResources(ResourceLookup):
    def __init__(self, by_pid: Mapping[int, Mapping[str, Any]]) -> None:
        self.by_pid = by_pid

    def attributes(self, pid: int) -> Mapping[str, Any]:
        return self.by_pid.get(pid, {})


def http_span(number: int = 0, *, pid: int = 100, scope: str = "http", **overrides: Any) -> SpanRecord:
    """A typical server span of an HTTP request, with 8 attributes."""
    fields: dict[str, Any] = dict(
        trace_id=TRACE_ID,
        span_id=(number + 1).to_bytes(8, "big"),
        name="POST /v1/chat/completions",
        kind=SpanKind.SERVER,
        start_ns=1_700_000_000_000_000_000 + number * 1_000_000,
        end_ns=1_700_000_000_000_000_000 + number * 1_000_000 + 12_345_678,
        pid=pid,
        scope=scope,
        attributes={
            "http.request.method": "POST",
            "url.path": "/v1/chat/completions",
            "http.route": "/v1/chat/completions",
            "http.response.status_code": 200,
            "server.address": "10.0.0.7",
            "server.port": 8000,
            "network.protocol.version": "1.1",
            "http.response.body.size": 18_234,
        },
    )
    fields.update(overrides)
    return SpanRecord(**fields)


def only_span(request: Any) -> Any:
    [resource_spans] = request.resource_spans
    [scope_spans] = resource_spans.scope_spans
    [span] = scope_spans.spans
    return span


def attribute_values(key_values: Any) -> dict[str, tuple[str, Any]]:
    """key -> (which oneof field is set, its value): checks the type, not just the value."""
    out = {}
    for kv in key_values:
        which = kv.value.WhichOneof("value")
        out[kv.key] = (which, getattr(kv.value, which) if which else None)
    return out


def test_every_field_of_a_span_is_encoded() -> None:
    link_trace = bytes(16 * [0xAB])
    span = http_span(
        span_id=SPAN_ID,
        parent_span_id=PARENT_ID,
        kind=SpanKind.CLIENT,
        trace_state="vendor=abc",
        status_code=StatusCode.ERROR,
        status_message="upstream reset",
        links=[SpanLink(link_trace, PARENT_ID, {"link.reason": "retry-of"})],
    )

    encoded = only_span(encode_request([span], StaticResources({})))

    assert encoded.trace_id == TRACE_ID
    assert encoded.span_id == SPAN_ID
    assert encoded.parent_span_id == PARENT_ID
    assert encoded.trace_state == "vendor=abc"
    assert encoded.name == "POST /v1/chat/completions"
    assert encoded.kind == 3  # SPAN_KIND_CLIENT
    assert encoded.start_time_unix_nano == span.start_ns
    assert encoded.end_time_unix_nano == span.end_ns
    assert encoded.status.code == 2  # STATUS_CODE_ERROR
    assert encoded.status.message == "upstream reset"
    [link] = encoded.links
    assert (link.trace_id, link.span_id) == (link_trace, PARENT_ID)
    assert attribute_values(link.attributes) == {"link.reason": ("string_value", "retry-of")}
    assert attribute_values(encoded.attributes)["http.response.status_code"] == ("int_value", 200)


def test_root_span_with_unset_status_leaves_optional_fields_empty() -> None:
    encoded = only_span(encode_request([http_span()], StaticResources({})))

    assert encoded.parent_span_id == b""
    assert encoded.trace_state == ""
    assert not encoded.HasField("status")
    assert len(encoded.links) == 0


def test_attribute_values_keep_their_types_bool_before_int() -> None:
    span = http_span(attributes={"flag": True, "off": False, "count": 7, "ratio": 0.25, "text": "hi", "zero": 0})

    values = attribute_values(only_span(encode_request([span], StaticResources({}))).attributes)

    assert values == {
        "flag": ("bool_value", True),
        "off": ("bool_value", False),
        "count": ("int_value", 7),
        "ratio": ("double_value", 0.25),
        "text": ("string_value", "hi"),
        "zero": ("int_value", 0),
    }


def test_unusual_attribute_values_are_coerced_not_fatal() -> None:
    span = http_span(
        attributes={
            "enum": StatusCode.ERROR,  # an int subclass
            "none": None,
            "raw": b"\x00\xff",
            "list": ["a", 1, None],
            "huge": 2**70,
            "undecodable": "caf\udce9",  # surrogateescape residue from bytes that were not UTF-8
            7: "non-str key",
        }
    )

    values = attribute_values(only_span(encode_request([span], StaticResources({}))).attributes)

    assert values["enum"] == ("int_value", 2)
    assert "none" not in values
    assert values["raw"] == ("bytes_value", b"\x00\xff")
    assert values["list"][0] == "array_value"
    assert [v.WhichOneof("value") for v in values["list"][1].values] == ["string_value", "int_value"]
    assert values["huge"] == ("string_value", str(2**70))
    assert values["undecodable"] == ("string_value", "caf\ufffd")
    assert values["7"] == ("string_value", "non-str key")


def test_malformed_span_fields_are_coerced_instead_of_raising() -> None:
    span = http_span(start_ns=-5, name=None, attributes={"ok": "yes"})

    encoded = only_span(encode_request([span], StaticResources({})))

    assert encoded.start_time_unix_nano == 0
    assert encoded.name == "None"
    assert encoded.trace_id == TRACE_ID
    assert attribute_values(encoded.attributes) == {"ok": ("string_value", "yes")}


def test_links_with_malformed_ids_are_left_out() -> None:
    good = SpanLink(bytes(16 * [1]), bytes(8 * [2]))
    not_bytes = SpanLink("0" * 16, "0" * 8)  # type: ignore[arg-type]
    span = http_span(links=[SpanLink(b"short", bytes(8 * [2])), good, not_bytes])

    links = only_span(encode_request([span], StaticResources({}))).links

    assert [(link.trace_id, link.span_id) for link in links] == [(good.trace_id, good.span_id)]


def test_spans_are_grouped_by_process_then_scope_with_resource_attributes() -> None:
    resources = StaticResources(
        {100: {"service.name": "api", "process.pid": 100}, 200: {"service.name": "vllm", "process.pid": 200}}
    )
    spans = [
        http_span(0, pid=100, scope="http"),
        http_span(1, pid=200, scope="http"),
        http_span(2, pid=100, scope="grpc"),
        http_span(3, pid=100, scope="http"),
    ]

    request = encode_request(spans, resources)

    assert len(request.resource_spans) == 2
    api, vllm = request.resource_spans
    assert attribute_values(api.resource.attributes) == {
        "service.name": ("string_value", "api"),
        "process.pid": ("int_value", 100),
    }
    assert attribute_values(vllm.resource.attributes)["service.name"] == ("string_value", "vllm")
    assert [(s.scope.name, s.scope.version) for s in api.scope_spans] == [
        ("http", otelbpf.__version__),
        ("grpc", otelbpf.__version__),
    ]
    assert [span.span_id for span in api.scope_spans[0].spans] == [spans[0].span_id, spans[3].span_id]
    assert [span.span_id for span in api.scope_spans[1].spans] == [spans[2].span_id]
    assert [span.span_id for span in vllm.scope_spans[0].spans] == [spans[1].span_id]


def test_a_failing_resource_lookup_keeps_the_spans() -> None:
    class Broken(ResourceLookup):
        def attributes(self, pid: int) -> Mapping[str, Any]:
            raise KeyError(pid)

    request = encode_request([http_span()], Broken())

    assert len(request.resource_spans[0].resource.attributes) == 0
    assert len(request.resource_spans[0].scope_spans[0].spans) == 1


def test_span_batch_encodes_once_and_shares_the_request() -> None:
    batch = SpanBatch([http_span(i) for i in range(5)], StaticResources({}))

    assert batch.payload is batch.payload
    assert batch.request is batch.request
    assert batch.request.SerializeToString() == batch.payload
    trimmed = batch.without_oldest(2)
    assert len(trimmed) == 3
    assert [s.span_id for s in trimmed.request.resource_spans[0].scope_spans[0].spans] == [
        span.span_id for span in batch.spans[2:]
    ]


def test_serialize_request_is_the_request_serialized() -> None:
    spans = [http_span(i, pid=100 + i % 2, scope=("http", "grpc")[i % 3 == 0]) for i in range(20)]
    resources = StaticResources({100: {"service.name": "api", "process.pid": 100}})

    payload = serialize_request(spans, resources)

    assert payload == encode_request(spans, resources).SerializeToString()
    assert serialize_request([], resources) == b""


def test_a_large_batch_decodes_whole_at_the_receiver() -> None:
    """10k spans of four processes in one payload: the official protobufs read back every
    span under its own process (its rate is bench/export_encoding.py's to measure)."""
    spans = [http_span(i, pid=100 + i % 4) for i in range(10_000)]
    resources = StaticResources({100 + i: {"service.name": f"svc{i}"} for i in range(4)})

    request = ExportTraceServiceRequest.FromString(serialize_request(spans, resources))

    per_service = {}
    for resource_spans in request.resource_spans:
        name = next(a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name")
        per_service[name] = sum(len(s.spans) for s in resource_spans.scope_spans)
    assert per_service == {f"svc{i}": 2_500 for i in range(4)}
