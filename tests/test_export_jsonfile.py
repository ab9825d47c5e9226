"""JsonFileSink and read_json_file: Collector file-exporter encoding, round trip, whole lines."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otelbpf.core.model import ResourceLookup, SpanKind, SpanLink, SpanRecord, StatusCode
from otelbpf.export import JsonFileSink, SpanBatch, from_otlp_json, read_json_file, to_otlp_json


class StaticResources(ResourceLookup):
    def __init__(self, by_pid: Mapping[int, Mapping[str, Any]]) -> None:
        self.by_pid = by_pid

    def attributes(self, pid: int) -> Mapping[str, Any]:
        return self.by_pid.get(pid, {})


RESOURCES = StaticResources({42: {"service.name": "api", "process.pid": 42}})


def span(number: int, **overrides: Any) -> SpanRecord:
    fields: dict[str, Any] = dict(
        trace_id=bytes.fromhex("0af7651916cd43dd8448eb211c80319c"),
        span_id=bytes.fromhex("b7ad6b7169203331") if number == 0 else number.to_bytes(8, "big"),
        name="GET /health",
        kind=SpanKind.SERVER,
        start_ns=1_700_000_000_000_000_000 + number,
        end_ns=1_700_000_000_001_000_000 + number,
        pid=42,
        attributes={"http.response.status_code": 200, "url.path": "/health"},
    )
    fields.update(overrides)
    return SpanRecord(**fields)


def test_lines_are_what_the_collector_file_exporter_writes(tmp_path: Path) -> None:
    error_span = span(
        0,
        parent_span_id=bytes.fromhex("00f067aa0ba902b7"),
        kind=SpanKind.CLIENT,
        trace_state="k=v",
        status_code=StatusCode.ERROR,
        status_message="boom",
        attributes={"s": "x", "b": True, "i": 7, "d": 1.5},
        links=[SpanLink(bytes(16 * [0xAB]), bytes(8 * [0xCD]))],
    )
    sink = JsonFileSink(tmp_path / "spans.jsonl")

    assert sink.export(SpanBatch([error_span], RESOURCES))
    sink.shutdown()

    expected = (
        '{"resourceSpans":[{"resource":{"attributes":['
        '{"key":"service.name","value":{"stringValue":"api"}},'
        '{"key":"process.pid","value":{"intValue":"42"}}]},'
        '"scopeSpans":[{"scope":{"name":"otelbpf","version":"0.1.0"},"spans":[{'
        '"traceId":"0af7651916cd43dd8448eb211c80319c","spanId":"b7ad6b7169203331",'
        '"traceState":"k=v","parentSpanId":"00f067aa0ba902b7","name":"GET /health","kind":3,'
        '"startTimeUnixNano":"1700000000000000000","endTimeUnixNano":"1700000000001000000",'
        '"attributes":[{"key":"s","value":{"stringValue":"x"}},{"key":"b","value":{"boolValue":true}},'
        '{"key":"i","value":{"intValue":"7"}},{"key":"d","value":{"doubleValue":1.5}}],'
        '"links":[{"traceId":"abababababababababababababababab","spanId":"cdcdcdcdcdcdcdcd"}],'
        '"status":{"message":"boom","code":2}}]}]}]}\n'
    )
    assert (tmp_path / "spans.jsonl").read_text() == expected


def test_empty_fields_are_omitted_but_status_is_always_written() -> None:
    line = to_otlp_json(SpanBatch([span(1, attributes={})], StaticResources({})).request)

    document = json.loads(line)
    assert document["resourceSpans"][0]["resource"] == {}
    [written] = document["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert written["status"] == {}
    assert "parentSpanId" not in written
    assert "attributes" not in written and "links" not in written and "traceState" not in written


def test_every_line_parses_back_equal_to_the_encoded_request(tmp_path: Path) -> None:
    batches = [
        SpanBatch([span(1), span(2, parent_span_id=(1).to_bytes(8, "big"))], RESOURCES),
        SpanBatch([span(3, status_code=StatusCode.OK, links=[SpanLink(bytes(16 * [1]), bytes(8 * [2]), {"a": 1})])],
                  RESOURCES),
        SpanBatch([span(4, attributes={})], StaticResources({})),
    ]
    sink = JsonFileSink(tmp_path / "spans.jsonl")
    for batch in batches:
        assert sink.export(batch)
    sink.shutdown()

    assert read_json_file(tmp_path / "spans.jsonl") == [batch.request for batch in batches]


def test_each_line_is_flushed_when_export_returns(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    sink = JsonFileSink(path)

    sink.export(SpanBatch([span(1)], RESOURCES))
    first = path.read_text()  # a second reader, while the sink keeps the file open
    sink.export(SpanBatch([span(2)], RESOURCES))
    second = path.read_text()
    sink.shutdown()

    assert first.count("\n") == 1 and first.endswith("\n")
    assert second.count("\n") == 2 and second.startswith(first)


def test_appends_to_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    for number in (1, 2):
        sink = JsonFileSink(path)
        sink.export(SpanBatch([span(number)], RESOURCES))
        sink.shutdown()

    assert len(read_json_file(path)) == 2


def test_strings_are_escaped_like_go_and_non_ascii_kept() -> None:
    line = to_otlp_json(SpanBatch([span(1, name="<a&b> ünï\u2028")], RESOURCES).request)

    assert '"name":"\\u003ca\\u0026b\\u003e ünï\\u2028"' in line
    assert from_otlp_json(line).resource_spans[0].scope_spans[0].spans[0].name == "<a&b> ünï\u2028"


def test_doubles_are_written_as_the_collector_does() -> None:
    attributes = {"whole": 5.0, "nan": math.nan, "inf": math.inf, "neg": -math.inf, "small": 1e-7}
    line = to_otlp_json(SpanBatch([span(1, attributes=attributes)], RESOURCES).request)

    [written] = json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]
    values = {kv["key"]: kv["value"] for kv in written["attributes"]}
    assert values == {
        "whole": {"doubleValue": 5},
        "nan": {"doubleValue": "NaN"},
        "inf": {"doubleValue": "Infinity"},
        "neg": {"doubleValue": "-Infinity"},
        "small": {"doubleValue": 1e-7},
    }
    parsed = from_otlp_json(line).resource_spans[0].scope_spans[0].spans[0].attributes
    assert math.isnan(parsed[1].value.double_value) and parsed[2].value.double_value == math.inf


def test_reader_skips_an_unfinished_last_line_and_rejects_garbage(tmp_path: Path) -> None:
    whole = to_otlp_json(SpanBatch([span(1)], RESOURCES).request)
    path = tmp_path / "spans.jsonl"
    path.write_text(whole + "\n\n" + whole[:40])

    assert len(read_json_file(path)) == 1

    path.write_text(whole + "\n" + "not json\n")
    with pytest.raises(ValueError, match="spans.jsonl:2"):
        read_json_file(path)


def test_a_full_disk_is_a_retryable_failure_not_an_exception() -> None:
    sink = JsonFileSink("/dev/full")

    assert sink.export(SpanBatch([span(1)], RESOURCES)) is False
    sink.shutdown()
    assert sink.export(SpanBatch([span(1)], RESOURCES)) is False  # after shutdown: refused, not raised


def test_reads_hex_ids_back_to_bytes() -> None:
    line = to_otlp_json(SpanBatch([span(0, parent_span_id=bytes(8 * [7]))], RESOURCES).request)

    parsed: ExportTraceServiceRequest = from_otlp_json(line)

    parsed_span = parsed.resource_spans[0].scope_spans[0].spans[0]
    assert parsed_span.trace_id == bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
    assert parsed_span.span_id == bytes.fromhex("b7ad6b7169203331")
    assert parsed_span.parent_span_id == bytes(8 * [7])


def test_the_sink_writes_from_the_records_without_building_the_protobuf(tmp_path: Path) -> None:
    batch = SpanBatch([span(1), span(2, attributes={"ratio": 0.5, "ok": True})], RESOURCES)
    sink = JsonFileSink(tmp_path / "spans.jsonl")

    assert sink.export(batch)
    sink.shutdown()

    assert batch._payload is None and batch._request is None  # no OTLP sink asked for it: never built
    assert (tmp_path / "spans.jsonl").read_text() == to_otlp_json(batch.request) + "\n"
