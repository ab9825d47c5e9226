"""OTLP/JSON lines, written the way the OpenTelemetry Collector's file exporter writes them.

Each line is one ``ExportTraceServiceRequest`` in the OTLP/JSON encoding as
produced by the Collector (pdata's JSON marshaler), so files from the agent
and from a Collector can be read by the same tools (the Collector's
``otlpjsonfile`` receiver, jq scripts, our ``read_json_file``):

* lowerCamelCase keys, in the order of the .proto declarations;
* trace and span ids as lower-case hex, not protobuf-JSON's base64;
* enums (span kind, status code) as integers, 64-bit integers as strings;
* fields with default values omitted, except that ``resource``, ``scope`` and
  ``status`` objects are always present (the Collector emits ``"status":{}``);
* ``<``, ``>``, ``&``, U+2028 and U+2029 escaped as Go's encoder does.

The sink writes each line straight from the batch's SpanRecords and resource
attributes (``encode_json_line``), without building the protobuf request:
pre-rendered attribute fragments cached per (key, value) like the wire
encoder's, ``json``'s C string escaper, one flat list of pieces joined once.
Spans the fast path does not take (odd types, out-of-range numbers, strings
that are not valid UTF-8) are rendered from the protobuf message path
instead, so every line is exactly ``to_otlp_json(encode_request(...))``
(tests/test_export_equivalence.py checks that for random spans).

``to_otlp_json`` writes a request that is already a message (the walk
below). Why not ``google.protobuf.json_format``: it writes ids as base64 and
walks fields by reflection, several times slower. The walk covers the fields
``encode_request`` produces; the round-trip test in
tests/test_export_jsonfile.py fails if the encoder starts filling one that
is not written here.
"""

from __future__ import annotations

import base64
import json
import math
from json.encoder import encode_basestring as _json_string  # C; what json.dumps(ensure_ascii=False) uses
from pathlib import Path
from typing import Any, Mapping, Sequence

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

import otelbpf
from otelbpf.core.model import ResourceLookup, SpanRecord
from otelbpf.export.sinks import SpanBatch
from otelbpf.export.encode import group_spans, span_message
from otelbpf.otlp.jsonlines import JsonLinesSink, go_escaped, read_json_lines
from otelbpf.otlp.wire import UINT64_MAX, FragmentCache, Unusual, fill_attributes_safely, resource_attributes, text


class JsonFileSink(JsonLinesSink[SpanBatch]):
    """Appends one OTLP/JSON line per span batch to ``path`` (``encode_json_line``)."""

    def __init__(self, path: str | Path, *, name: str = "jsonfile") -> None:
        super().__init__(path, _batch_line, name=name)


def _batch_line(batch: SpanBatch) -> bytes:
    return encode_json_line(batch.spans, batch.resources)


def to_otlp_json(request: ExportTraceServiceRequest) -> str:
    """One line of Collector-style OTLP/JSON (no trailing newline)."""
    document = {"resourceSpans": [_resource_spans(rs) for rs in request.resource_spans]}
    return go_escaped(json.dumps(document, ensure_ascii=False, separators=(",", ":")))


def encode_json_line(spans: Sequence[SpanRecord], resources: ResourceLookup) -> bytes:
    """``(to_otlp_json(encode_request(spans, resources)) + "\\n").encode()``, written directly from the records."""
    try:
        return _json_line(spans, resources, checked=False)
    except UnicodeEncodeError:  # a lone surrogate somewhere: find it and coerce like the protobuf path does
        return _json_line(spans, resources, checked=True)


def from_otlp_json(line: str) -> ExportTraceServiceRequest:
    """Parse one OTLP/JSON line (hex ids) back into a request."""
    document = json.loads(line)
    for resource_spans in document.get("resourceSpans", ()):
        _drop_if_empty(resource_spans, "resource")
        for scope_spans in resource_spans.get("scopeSpans", ()):
            _drop_if_empty(scope_spans, "scope")
            for span in scope_spans.get("spans", ()):
                _hex_ids_to_base64(span, ("traceId", "spanId", "parentSpanId"))
                _drop_if_empty(span, "status")
                for link in span.get("links", ()):
                    _hex_ids_to_base64(link, ("traceId", "spanId"))
    return json_format.ParseDict(document, ExportTraceServiceRequest())


def read_json_file(path: str | Path) -> list[ExportTraceServiceRequest]:
    """All complete lines of an OTLP/JSON traces file as requests.

    A last line without its newline is still being written and is skipped;
    a malformed complete line raises ValueError naming the line.
    """
    errors = (ValueError, TypeError, AttributeError, json_format.ParseError)
    return read_json_lines(path, from_otlp_json, "trace request", errors)


# --- writer: proto -> dicts in the Collector's key order ---------------------


def _resource_spans(resource_spans: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"resource": _attributes_object(resource_spans.resource.attributes)}
    out["scopeSpans"] = [_scope_spans(scope_spans) for scope_spans in resource_spans.scope_spans]
    return out


def _scope_spans(scope_spans: Any) -> dict[str, Any]:
    scope = scope_spans.scope
    scope_out: dict[str, Any] = {}
    if scope.name:
        scope_out["name"] = scope.name
    if scope.version:
        scope_out["version"] = scope.version
    return {"scope": scope_out, "spans": [_span(span) for span in scope_spans.spans]}


def _span(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"traceId": span.trace_id.hex(), "spanId": span.span_id.hex()}
    if span.trace_state:
        out["traceState"] = span.trace_state
    if span.parent_span_id:
        out["parentSpanId"] = span.parent_span_id.hex()
    if span.name:
        out["name"] = span.name
    if span.kind:
        out["kind"] = span.kind
    if span.start_time_unix_nano:
        out["startTimeUnixNano"] = str(span.start_time_unix_nano)
    if span.end_time_unix_nano:
        out["endTimeUnixNano"] = str(span.end_time_unix_nano)
    if span.attributes:
        out["attributes"] = _key_values(span.attributes)
    if span.links:
        out["links"] = [_link(link) for link in span.links]
    status: dict[str, Any] = {}
    if span.status.message:
        status["message"] = span.status.message
    if span.status.code:
        status["code"] = span.status.code
    out["status"] = status
    return out


def _link(link: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"traceId": link.trace_id.hex(), "spanId": link.span_id.hex()}
    if link.trace_state:
        out["traceState"] = link.trace_state
    if link.attributes:
        out["attributes"] = _key_values(link.attributes)
    return out


def _attributes_object(attributes: Any) -> dict[str, Any]:
    return {"attributes": _key_values(attributes)} if attributes else {}


def _key_values(key_values: Any) -> list[dict[str, Any]]:
    return [{"key": kv.key, "value": _any_value(kv.value)} for kv in key_values]


def _any_value(value: AnyValue) -> dict[str, Any]:
    which = value.WhichOneof("value")
    if which == "string_value":
        return {"stringValue": value.string_value}
    if which == "int_value":
        return {"intValue": str(value.int_value)}
    if which == "bool_value":
        return {"boolValue": value.bool_value}
    if which == "double_value":
        return {"doubleValue": _json_double(value.double_value)}
    if which == "bytes_value":
        return {"bytesValue": base64.b64encode(value.bytes_value).decode("ascii")}
    if which == "array_value":
        return {"arrayValue": {"values": [_any_value(item) for item in value.array_value.values]}}
    if which == "kvlist_value":
        return {"kvlistValue": {"values": _key_values(value.kvlist_value.values)}}
    return {}


def _json_double(number: float) -> float | int | str:
    """Go prints whole doubles without ``.0``; JSON has no NaN/Infinity, proto-JSON spells them."""
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "Infinity" if number > 0 else "-Infinity"
    if number.is_integer() and abs(number) < 1e21:
        return int(number)
    return number


def _drop_if_empty(message: dict[str, Any], key: str) -> None:
    """The Collector always writes these objects; absent and empty mean the same, and compare equal."""
    if message.get(key) == {}:
        del message[key]


def _hex_ids_to_base64(message: dict[str, Any], keys: tuple[str, ...]) -> None:
    for key in keys:
        value = message.get(key)
        if value:
            message[key] = base64.b64encode(bytes.fromhex(value)).decode("ascii")



# --- writer: records -> text, directly ----------------------------------------


def _json_line(spans: Sequence[SpanRecord], resources: ResourceLookup, checked: bool) -> bytes:
    """With ``checked``, each span and resource is checked for text UTF-8 cannot encode (lone surrogates,
    which json keeps but protobuf refuses) and re-rendered by the message path, which replaces them."""
    out = ['{"resourceSpans":[']
    append = out.append
    separator = ""
    for pid, by_scope in group_spans(spans).items():
        append(separator)
        separator = ","
        append('{"resource":')
        append(_json_resource(resources, pid, checked))
        append(',"scopeSpans":[')
        scope_separator = ""
        for scope, records in by_scope.items():
            append(scope_separator)
            scope_separator = ","
            append(_json_scope_head(scope))
            for span in records:
                try:
                    fragment = _json_span(span)
                except Exception:  # noqa: BLE001 - anything unusual: from the message, as before
                    fragment = _json_span_from_message(span)
                if checked:
                    try:
                        fragment.encode()
                    except UnicodeEncodeError:
                        fragment = _json_span_from_message(span)
                append(fragment)
                append(",")
            out[-1] = "]}"  # in place of the last span's comma
        append("]}")
    append("]}\n")
    return go_escaped("".join(out)).encode()


_KIND_JSON = {0: "", **{kind: f',"kind":{kind}' for kind in range(1, 6)}}
_STATUS_CODE_JSON = {0: "", 1: '"code":1', 2: '"code":2'}


def _json_span(span: SpanRecord) -> str:
    """A well-typed span's JSON object; raises for anything else (as ``_wire_span`` does)."""
    trace_id, span_id = span.trace_id, span.span_id
    if type(trace_id) is not bytes or len(trace_id) != 16 or type(span_id) is not bytes or len(span_id) != 8:
        raise Unusual
    trace_state = span.trace_state
    if trace_state:
        if type(trace_state) is not str:
            raise Unusual
        trace_state = ',"traceState":' + _json_string(trace_state)
    else:
        trace_state = ""
    parent = span.parent_span_id
    if parent:
        if type(parent) is not bytes or len(parent) != 8:
            raise Unusual
        parent = ',"parentSpanId":"' + parent.hex() + '"'
    else:
        parent = ""
    name = span.name
    if type(name) is not str:
        raise Unusual
    name = ',"name":' + _json_string(name) if name else ""
    start, end = span.start_ns, span.end_ns
    if type(start) is not int or type(end) is not int or not (0 < start <= UINT64_MAX and 0 < end <= UINT64_MAX):
        times = _json_times(start, end)
    else:
        times = f',"startTimeUnixNano":"{start}","endTimeUnixNano":"{end}"'
    attributes = span.attributes
    attributes = ',"attributes":[' + _json_attributes(attributes) + "]" if attributes else ""
    links = span.links
    links = _json_links(links) if links else ""
    code, message = span.status_code, span.status_message
    if code or message:
        if type(message) is not str:
            raise Unusual
        code = _STATUS_CODE_JSON[code]
        if message:
            status = '{"message":' + _json_string(message) + ("," + code if code else "") + "}"
        else:
            status = "{" + code + "}"
    else:
        status = "{}"
    return (
        f'{{"traceId":"{trace_id.hex()}","spanId":"{span_id.hex()}"{trace_state}{parent}{name}'
        f'{_KIND_JSON[span.kind]}{times}{attributes}{links},"status":{status}}}'
    )


def _json_times(start: object, end: object) -> str:
    """Start and end when one is zero (left out) or either is not an int in uint64 range (raises)."""
    out = ""
    for key, value in (("startTimeUnixNano", start), ("endTimeUnixNano", end)):
        if type(value) is not int or not 0 <= value <= UINT64_MAX:
            raise Unusual
        if value:
            out += f',"{key}":"{value}"'
    return out


def _json_links(links: Sequence[object]) -> str:
    rendered = []
    for link in links:
        trace_id, span_id = link.trace_id, link.span_id  # type: ignore[attr-defined]
        if type(trace_id) is not bytes or type(span_id) is not bytes:
            raise Unusual
        if len(trace_id) != 16 or len(span_id) != 8:
            continue  # left out of the request, as by the encoder
        attributes = link.attributes  # type: ignore[attr-defined]
        attributes = ',"attributes":[' + _json_attributes(attributes) + "]" if attributes else ""
        rendered.append(f'{{"traceId":"{trace_id.hex()}","spanId":"{span_id.hex()}"{attributes}}}')
    return ',"links":[' + ",".join(rendered) + "]" if rendered else ""


def _json_key_value(key: object, value: object) -> str:
    """One attribute's JSON object, for a str/int/float/bool value; raises for anything else."""
    if type(key) is not str:
        raise Unusual
    kind = type(value)
    if kind is str:
        rendered = '{"stringValue":' + _json_string(value) + "}"
    elif kind is int:
        if not -(2**63) <= value < 2**63:  # type: ignore[operator]
            raise Unusual  # the message path writes it as a string
        rendered = f'{{"intValue":"{value}"}}'
    elif kind is bool:
        rendered = '{"boolValue":true}' if value else '{"boolValue":false}'
    elif kind is float:
        rendered = '{"doubleValue":' + json.dumps(_json_double(value)) + "}"  # type: ignore[arg-type]
    else:
        raise Unusual
    return '{"key":' + _json_string(key) + ',"value":' + rendered + "}"


_JSON_CACHE = FragmentCache(_json_key_value)


def _json_attributes(attributes: Mapping[str, object]) -> str:
    """The comma-separated attribute objects; raises for any value the fast path does not take."""
    return ",".join(_JSON_CACHE.fragments(attributes, []))


def _json_resource(resources: ResourceLookup, pid: int, checked: bool) -> str:
    attributes = resource_attributes(resources, pid)
    try:
        rendered = _json_attributes(attributes)
        if checked:
            rendered.encode()
    except Exception:  # noqa: BLE001 - odd values: coerced by the message path, as before
        message = Resource()
        fill_attributes_safely(message.attributes, attributes)
        return _dumps(_attributes_object(message.attributes))
    return '{"attributes":[' + rendered + "]}" if rendered else "{}"


_SCOPE_HEADS: dict[str, str] = {}


def _json_scope_head(scope: object) -> str:
    """``{"scope":{...},"spans":[`` for a scope name (``_text`` makes any name valid UTF-8)."""
    head = _SCOPE_HEADS.get(scope) if type(scope) is str else None  # type: ignore[call-overload]
    if head is None:
        scope_out: dict[str, str] = {}
        name = text(scope)
        if name:
            scope_out["name"] = name
        if otelbpf.__version__:
            scope_out["version"] = otelbpf.__version__
        head = '{"scope":' + _dumps(scope_out) + ',"spans":['
        if type(scope) is str and len(_SCOPE_HEADS) < 1024:
            _SCOPE_HEADS[scope] = head
    return head


def _json_span_from_message(span: SpanRecord) -> str:
    return _dumps(_span(span_message(span)))


def _dumps(document: object) -> str:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"))
