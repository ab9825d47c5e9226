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

Why not ``google.protobuf.json_format``: it writes ids as base64 and walks
fields by reflection, several times slower than the direct walk below.

The writer covers the fields ``encode_request`` produces; the round-trip test
in tests/test_export_jsonfile.py fails if the encoder starts filling one that
is not written here.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import threading
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from otelbpf.export.base import FailureLog, SpanBatch, SpanSink

_log = logging.getLogger(__name__)

_GO_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


class JsonFileSink(SpanSink):
    """Appends one OTLP/JSON line per batch to ``path``, flushed so a reader tailing it sees whole lines."""

    def __init__(self, path: str | Path, *, name: str = "jsonfile") -> None:
        self.name = name
        self.path = Path(path)
        # Opened now so that a bad path fails at startup, not at the first batch.
        self._file = open(self.path, "ab")  # noqa: SIM115 - lives as long as the sink
        self._lock = threading.Lock()
        self._failures = FailureLog(_log, name)

    def export(self, batch: SpanBatch) -> bool:
        try:
            line = (to_otlp_json(batch.request) + "\n").encode("utf-8")
        except Exception as exc:  # noqa: BLE001 - a sink never raises
            self._failures.failed(type(exc).__name__, exc)
            return False
        with self._lock:
            if self._file.closed:
                return False
            return self._append(line)

    def _append(self, line: bytes) -> bool:
        start = self._file.tell()
        try:
            self._file.write(line)
            self._file.flush()
        except OSError as exc:
            self._failures.failed(type(exc).__name__, exc)
            self._remove_partial_line(start)
            return False
        self._failures.succeeded()
        return True

    def _remove_partial_line(self, start: int) -> None:
        """After a failed write (disk full), cut the half line so the retry starts a clean one."""
        try:
            self._file.truncate(start)
        except OSError as exc:
            _log.debug("sink %s: could not truncate partial line: %s", self.name, exc)

    def shutdown(self) -> None:
        with self._lock:
            try:
                self._file.close()
            except OSError as exc:
                _log.debug("sink %s: close failed: %s", self.name, exc)


def to_otlp_json(request: ExportTraceServiceRequest) -> str:
    """One line of Collector-style OTLP/JSON (no trailing newline)."""
    document = {"resourceSpans": [_resource_spans(rs) for rs in request.resource_spans]}
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).translate(_GO_ESCAPES)


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
    """All complete lines of an OTLP/JSON file as requests.

    A last line without its newline is still being written and is skipped;
    a malformed complete line raises ValueError naming the line.
    """
    requests: list[ExportTraceServiceRequest] = []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if not line.endswith("\n") or not line.strip():
                continue
            try:
                requests.append(from_otlp_json(line))
            except (ValueError, TypeError, AttributeError, json_format.ParseError) as exc:
                raise ValueError(f"{path}:{number}: not an OTLP/JSON trace request: {exc}") from exc
    return requests


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

