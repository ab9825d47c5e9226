"""SpanRecords straight into an OTLP ``ExportTraceServiceRequest``.

Why not the SDK: its span API costs ~17 us per span, and its encoder walks
SDK objects. Filling ``opentelemetry.proto`` messages in place (``.add()``,
plain attribute assignment) is the fastest way to build them from Python with
the upb backend (``test_encode_throughput`` in tests/test_export_encode.py
measures it).

Grouping follows OTLP: one ``ResourceSpans`` per process (``pid``), with the
resource attributes from a ``ResourceLookup``, and inside it one
``ScopeSpans`` per instrumentation scope (the protocol that produced the
span), versioned with the agent's version.

Bad field contents never raise: the hot loop assumes well-typed records and,
if a span trips it (a huge int, a string that is not valid UTF-8, an odd
attribute type), that span is rebuilt by a slower path that coerces each field
instead. Links with malformed ids are left out, since a collector rejects a
whole request over one. (The records themselves, with their own ids, pid and
scope, are checked once by the BatchSpanProcessor's ``on_end``.)
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

import otelbpf
from otelbpf.model import ResourceLookup, SpanRecord

_log = logging.getLogger(__name__)

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_UINT64_MAX = 2**64 - 1


def encode_request(spans: Sequence[SpanRecord], resources: ResourceLookup) -> ExportTraceServiceRequest:
    """Build one OTLP trace request for ``spans``, grouped by process and scope."""
    request = ExportTraceServiceRequest()
    groups: dict[int, _ResourceGroup] = {}
    for span in spans:
        group = groups.get(span.pid)
        if group is None:
            group = groups[span.pid] = _ResourceGroup(request, resources, span.pid)
        scope_spans = group.scope_spans(span.scope)
        try:
            _fill_span(scope_spans.spans.add(), span)
        except Exception:  # noqa: BLE001 - any malformed field: take the careful path
            del scope_spans.spans[-1]
            _fill_span_defensively(scope_spans.spans.add(), span)
    return request


class _ResourceGroup:
    """One process's ``ResourceSpans`` and its ``ScopeSpans`` by scope name."""

    __slots__ = ("resource_spans", "by_scope")

    def __init__(self, request: ExportTraceServiceRequest, resources: ResourceLookup, pid: int) -> None:
        self.resource_spans: ResourceSpans = request.resource_spans.add()
        _fill_resource(self.resource_spans, resources, pid)
        self.by_scope: dict[str, ScopeSpans] = {}

    def scope_spans(self, scope: str) -> ScopeSpans:
        scope_spans = self.by_scope.get(scope)
        if scope_spans is None:
            scope_spans = self.by_scope[scope] = self.resource_spans.scope_spans.add()
            scope_spans.scope.name = _text(scope)
            scope_spans.scope.version = otelbpf.__version__
        return scope_spans


def _fill_resource(resource_spans: ResourceSpans, resources: ResourceLookup, pid: int) -> None:
    try:
        attributes = resources.attributes(pid)
    except Exception as exc:  # noqa: BLE001 - a lookup bug must not lose the spans
        _log.warning("resource lookup failed for pid %s (%s); exporting without resource attributes", pid, exc)
        return
    _fill_attributes_safely(resource_spans.resource.attributes, attributes)


def _fill_span(out: Span, span: SpanRecord) -> None:
    """The fast path: assumes the record is well typed (raises otherwise)."""
    out.trace_id = span.trace_id
    out.span_id = span.span_id
    if span.parent_span_id:
        out.parent_span_id = span.parent_span_id
    if span.trace_state:
        out.trace_state = span.trace_state
    out.name = span.name
    out.kind = span.kind
    out.start_time_unix_nano = span.start_ns
    out.end_time_unix_nano = span.end_ns
    if span.attributes:
        _fill_attributes(out.attributes, span.attributes)
    if span.status_code or span.status_message:
        out.status.code = span.status_code
        out.status.message = span.status_message
    for link in span.links:
        if len(link.trace_id) != 16 or len(link.span_id) != 8:
            continue  # a collector rejects the whole request over one malformed id
        out_link = out.links.add()
        out_link.trace_id = link.trace_id
        out_link.span_id = link.span_id
        if link.attributes:
            _fill_attributes(out_link.attributes, link.attributes)


def _fill_attributes(out: Any, attributes: Mapping[str, Any]) -> None:
    """Typed AnyValues; exact ``type`` checks put bool before int for free."""
    for key, value in attributes.items():
        kv = out.add()
        kv.key = key
        kind = type(value)
        if kind is str:
            kv.value.string_value = value
        elif kind is int:
            kv.value.int_value = value
        elif kind is float:
            kv.value.double_value = value
        elif kind is bool:
            kv.value.bool_value = value
        else:
            del out[-1]
            _add_coerced_attribute(out, key, value)


# --- the careful path, for records the fast path refused -------------------


def _fill_span_defensively(out: Span, span: SpanRecord) -> None:
    """Coerce every field; never raises. Rare, so clarity beats speed here."""
    _log.debug("span %r needed coercion while encoding", span.name)
    out.trace_id = _id_bytes(span.trace_id, 16)
    out.span_id = _id_bytes(span.span_id, 8)
    out.parent_span_id = _id_bytes(span.parent_span_id, 8)
    out.trace_state = _text(span.trace_state)
    out.name = _text(span.name)
    out.kind = _bounded_int(span.kind, 0, 5)
    out.start_time_unix_nano = _bounded_int(span.start_ns, 0, _UINT64_MAX)
    out.end_time_unix_nano = _bounded_int(span.end_ns, 0, _UINT64_MAX)
    _fill_attributes_safely(out.attributes, span.attributes)
    if span.status_code or span.status_message:
        out.status.code = _bounded_int(span.status_code, 0, 2)
        out.status.message = _text(span.status_message)
    for link in _iterable(span.links):
        trace_id, span_id = _id_bytes(getattr(link, "trace_id", b""), 16), _id_bytes(getattr(link, "span_id", b""), 8)
        if trace_id and span_id:
            out_link = out.links.add(trace_id=trace_id, span_id=span_id)
            _fill_attributes_safely(out_link.attributes, getattr(link, "attributes", {}))


def _fill_attributes_safely(out: Any, attributes: Any) -> None:
    try:
        items = list(attributes.items())
    except Exception:  # noqa: BLE001 - not a mapping: nothing usable
        return
    for key, value in items:
        _add_coerced_attribute(out, key, value)


def _add_coerced_attribute(out: Any, key: Any, value: Any) -> None:
    """Append ``key=value`` with the closest OTLP type; ``None`` is left out."""
    if value is None:
        return
    any_value = _coerce_any_value(value)
    out.append(KeyValue(key=_text(key), value=any_value))


def _coerce_any_value(value: Any, depth: int = 0) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        if _INT64_MIN <= value <= _INT64_MAX:
            return AnyValue(int_value=int(value))
        return AnyValue(string_value=str(int(value)))
    if isinstance(value, float):
        return AnyValue(double_value=float(value))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return AnyValue(bytes_value=bytes(value))
    if isinstance(value, (list, tuple)) and depth < 4:
        array = AnyValue()
        array.array_value.values.extend(_coerce_any_value(item, depth + 1) for item in value if item is not None)
        return array
    return AnyValue(string_value=_text(value))


def _text(value: Any) -> str:
    """A str protobuf accepts: lone surrogates (from undecodable bytes) become U+FFFD."""
    text = value if isinstance(value, str) else str(value)
    try:
        text.encode("utf-8")
        return str(text)
    except UnicodeEncodeError:
        pass
    try:  # bytes smuggled in by surrogateescape decoding: back to bytes, then U+FFFD for the bad ones
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def _id_bytes(value: Any, size: int) -> bytes:
    """The id if it has the right size, else empty (which collectors accept, unlike a wrong size)."""
    if isinstance(value, (bytes, bytearray, memoryview)) and len(value) == size:
        return bytes(value)
    return b""


def _bounded_int(value: Any, low: int, high: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return low
    return min(max(number, low), high)


def _iterable(value: Any) -> list[Any]:
    try:
        return list(value)
    except TypeError:
        return []
