"""SpanRecords straight into OTLP ``ExportTraceServiceRequest`` bytes.

Why not the SDK: its span API costs ~17 us per span, and its encoder walks
SDK objects. Why not even ``opentelemetry.proto`` messages: filling them field
by field from Python (the fastest way with the upb backend) still costs ~1 us
per attribute, and sinks then serialize them again. The protobuf wire format
is simple, so the hot path writes the bytes itself (``serialize_request``):

* a span is ``tag, length, bytes`` fields in field-number order, exactly what
  upb's serializer writes for the same message (tests/test_export_encode.py
  checks byte equality against the message-built request for random spans);
* an attribute is one ``KeyValue``; its encoding (length-prefixed, without
  the repeated field's tag) is cached per (key, value) for str and int values
  (``otelbpf.otlp.wire.FragmentCache``), since most attributes of a span repeat across
  requests (method, scheme, route, peer address, status code, ...);
* nested lengths (``ScopeSpans``, ``ResourceSpans``) are added up as the
  parts are appended to one flat list, joined once at the end: no
  intermediate copies of large buffers.

``encode_request`` parses those bytes back into a message, for callers that
want one; the OTLP sinks send the bytes as they are (``SpanBatch.payload``).
A span's own bytes (``wire_part``) can be made apart from the request and
joined later (``serialize_parts``): the batch processor encodes a batch's
spans when it seals the batch, if only OTLP sinks read it.

Grouping follows OTLP: one ``ResourceSpans`` per process (``pid``), with the
resource attributes from a ``ResourceLookup``, and inside it one
``ScopeSpans`` per instrumentation scope (the protocol that produced the
span), versioned with the agent's version; both in order of first appearance.

Bad field contents never raise. The fast path only takes what it knows: ids
of the right size, exact ``str``/``int``/``float``/``bool`` values in range,
known kinds and status codes. Any other span is encoded by the message path
it replaced (``span_message``: fill a ``Span`` message, and if a field trips
it, rebuild it by the careful path that coerces each field), so odd records
come out exactly as they always did. Links with malformed ids are left out,
since a collector rejects a whole request over one. (The records themselves,
with their own ids, pid and scope, are checked once by the
BatchSpanProcessor's ``on_end``.)
"""

from __future__ import annotations

import logging
import struct
from typing import Any, Sequence

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

import otelbpf
from otelbpf.core.model import ResourceLookup, SpanRecord
from otelbpf.otlp.wire import (
    FIXED64,
    TABLE_SIZE,
    UINT64_MAX,
    VARINTS,
    Unusual,
    bounded_int,
    fill_attributes,
    fill_attributes_safely,
    id_bytes,
    iterable,
    resource_attributes,
    text,
    varint,
    wire_attributes,
    wire_resource,
    wire_scope,
)

_log = logging.getLogger(__name__)


def encode_request(spans: Sequence[SpanRecord], resources: ResourceLookup) -> ExportTraceServiceRequest:
    """Build one OTLP trace request for ``spans``, grouped by process and scope."""
    return ExportTraceServiceRequest.FromString(serialize_request(spans, resources))


def serialize_request(spans: Sequence[SpanRecord], resources: ResourceLookup) -> bytes:
    """``encode_request(spans, resources).SerializeToString()``, written directly (the fast path)."""
    return serialize_parts([wire_part(span) for span in spans], resources)


def wire_part(span: SpanRecord) -> tuple:
    """What a request needs of one span: ``(pid, scope, its Span message bytes)``.

    The batch processor makes them when it seals a batch that only OTLP
    sinks read (``EncodedSpanBatch``): on the pipeline's thread, where the
    records were made and are then freed, not on the export thread.
    """
    try:
        body = _wire_span(span)
    except Exception:  # noqa: BLE001 - anything unusual: the message path, as before
        body = span_message(span).SerializeToString()
    return (span.pid, span.scope, body)


def serialize_parts(parts: list, resources: ResourceLookup) -> bytes:
    """The request of spans already made into ``wire_part`` s, grouped by process
    and scope in order of first appearance (the same bytes as ``serialize_request``)."""
    out: list[bytes] = []
    append = out.append
    for pid, by_scope in _group_parts(parts).items():
        resource_spans_at = len(out)
        append(b"")  # the ResourceSpans tag and length, once known
        resource = wire_resource(resource_attributes(resources, pid))
        size = len(resource)
        append(resource)
        for scope, bodies in by_scope.items():
            scope_spans_at = len(out)
            append(b"")  # the ScopeSpans tag and length
            scope_field = wire_scope(scope)
            append(scope_field)
            scope_size = len(scope_field)
            for body in bodies:
                length = len(body)
                head = _SPAN_HEADS[length] if length < TABLE_SIZE else b"\x12" + varint(length)
                append(head)
                append(body)
                scope_size += len(head) + length
            out[scope_spans_at] = head = b"\x12" + varint(scope_size)
            size += len(head) + scope_size
        out[resource_spans_at] = b"\x0a" + varint(size)
    return b"".join(out)


def _group_parts(parts: list) -> dict[Any, dict[Any, list]]:
    """pid -> scope -> the third item of each ``(pid, scope, item)``, each in
    order of first appearance (the request's layout)."""
    groups: dict[Any, dict[Any, list]] = {}
    for pid, scope, item in parts:
        by_scope = groups.get(pid)
        if by_scope is None:
            by_scope = groups[pid] = {}
        items = by_scope.get(scope)
        if items is None:
            by_scope[scope] = [item]
        else:
            items.append(item)
    return groups


def group_spans(spans: Sequence[SpanRecord]) -> dict[Any, dict[Any, list[SpanRecord]]]:
    """pid -> scope -> spans, each in order of first appearance (the request's layout)."""
    return _group_parts([(span.pid, span.scope, span) for span in spans])


# --- protobuf wire format ----------------------------------------------------
#
# Field tags used below (field number << 3 | wire type; 2 = length-delimited,
# 0 = varint, 1 = 64-bit):
#   ExportTraceServiceRequest.resource_spans 1 -> 0x0a
#   ResourceSpans.resource 1 -> 0x0a, .scope_spans 2 -> 0x12
#   Resource.attributes 1 -> 0x0a;  ScopeSpans.scope 1 -> 0x0a, .spans 2 -> 0x12
#   Span.trace_id 1 -> 0x0a, span_id 2 -> 0x12, trace_state 3 -> 0x1a, parent_span_id 4 -> 0x22,
#        name 5 -> 0x2a, kind 6 -> 0x30, start_time_unix_nano 7 -> 0x39, end_time_unix_nano 8 -> 0x41,
#        attributes 9 -> 0x4a, links 13 -> 0x6a, status 15 -> 0x7a
#   Span.Link.trace_id 1 -> 0x0a, span_id 2 -> 0x12, attributes 4 -> 0x22
#   Status.message 2 -> 0x12, code 3 -> 0x18
#   KeyValue.key 1 -> 0x0a, value 2 -> 0x12
#   AnyValue.string_value 1 -> 0x0a, bool_value 2 -> 0x10, int_value 3 -> 0x18, double_value 4 -> 0x21


_SPAN_HEADS = [b"\x12" + prefix for prefix in VARINTS]  # ScopeSpans.spans tag + length

_KIND_FIELDS = {0: b"", **{kind: bytes((0x30, kind)) for kind in range(1, 6)}}
_STATUS_CODE_FIELDS = {0: b"", 1: b"\x18\x01", 2: b"\x18\x02"}
_TIMES = struct.Struct("<BQBQ").pack  # start and end time with their tags (fixed64, little-endian)


def _wire_span(span: SpanRecord) -> bytes:
    """A well-typed span's ``Span`` message bytes; raises for anything else."""
    trace_id, span_id = span.trace_id, span.span_id
    if type(trace_id) is not bytes or len(trace_id) != 16 or type(span_id) is not bytes or len(span_id) != 8:
        raise Unusual
    parts = [b"\x0a\x10", trace_id, b"\x12\x08", span_id]
    trace_state = span.trace_state
    if trace_state:
        if type(trace_state) is not str:
            raise Unusual
        encoded = trace_state.encode()
        parts += (b"\x1a" + varint(len(encoded)), encoded)
    parent = span.parent_span_id
    if parent:
        if type(parent) is not bytes or len(parent) != 8:
            raise Unusual
        parts += (b"\x22\x08", parent)
    name = span.name
    if type(name) is not str:
        raise Unusual
    if name:
        encoded = name.encode()
        parts += (b"\x2a" + varint(len(encoded)), encoded)
    parts.append(_KIND_FIELDS[span.kind])
    start, end = span.start_ns, span.end_ns
    if start and end:
        parts.append(_TIMES(0x39, start, 0x41, end))  # struct.error unless both are ints in uint64 range
    else:
        parts.append(_wire_times(start, end))
    attributes = span.attributes
    if attributes:
        parts.append(wire_attributes(attributes, b"\x4a"))
    links = span.links
    if links:
        for link in links:
            link_trace_id, link_span_id = link.trace_id, link.span_id
            if type(link_trace_id) is not bytes or type(link_span_id) is not bytes:
                raise Unusual
            if len(link_trace_id) != 16 or len(link_span_id) != 8:
                continue  # a collector rejects the whole request over one malformed id
            body = b"\x0a\x10" + link_trace_id + b"\x12\x08" + link_span_id
            if link.attributes:
                body += wire_attributes(link.attributes, b"\x22")
            parts += (b"\x6a" + varint(len(body)), body)
    code, message = span.status_code, span.status_message
    if code or message:
        if type(message) is not str:
            raise Unusual
        encoded = message.encode()
        status = (b"\x12" + varint(len(encoded)) + encoded if encoded else b"") + _STATUS_CODE_FIELDS[code]
        parts += (b"\x7a" + varint(len(status)), status)
    return b"".join(parts)


def _wire_times(start: Any, end: Any) -> bytes:
    """Start and end when one of them is zero (a zero fixed64 is left out, as upb does)."""
    out = b""
    for tag, value in ((0x39, start), (0x41, end)):
        if type(value) is not int:
            raise Unusual
        if value:
            out += bytes((tag,)) + FIXED64(value)
    return out


# --- the message path: the reference, and the fallback for unusual spans -----


def span_message(span: SpanRecord) -> Span:
    """``span`` as a ``Span`` message: filled directly, or coerced field by field if that trips."""
    out = Span()
    try:
        _fill_span(out, span)
    except Exception:  # noqa: BLE001 - any malformed field: take the careful path
        out = Span()
        _fill_span_defensively(out, span)
    return out


def _encode_request_via_messages(spans: Sequence[SpanRecord], resources: ResourceLookup) -> ExportTraceServiceRequest:
    """The message-building encoder ``serialize_request`` replaced (~5x slower).

    Kept as the reference: tests compare the fast path against it, and
    bench/export_encoding.py measures both.
    """
    request = ExportTraceServiceRequest()
    for pid, by_scope in group_spans(spans).items():
        resource_spans: ResourceSpans = request.resource_spans.add()
        fill_attributes_safely(resource_spans.resource.attributes, resource_attributes(resources, pid))
        for scope, records in by_scope.items():
            scope_spans: ScopeSpans = resource_spans.scope_spans.add()
            scope_spans.scope.name = text(scope)
            scope_spans.scope.version = otelbpf.__version__
            for span in records:
                out = scope_spans.spans.add()
                try:
                    _fill_span(out, span)
                except Exception:  # noqa: BLE001
                    del scope_spans.spans[-1]
                    _fill_span_defensively(scope_spans.spans.add(), span)
    return request


def _fill_span(out: Span, span: SpanRecord) -> None:
    """The message path's fast part: assumes the record is well typed (raises otherwise)."""
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
        fill_attributes(out.attributes, span.attributes)
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
            fill_attributes(out_link.attributes, link.attributes)


# --- the careful path, for records the fast path refused -------------------


def _fill_span_defensively(out: Span, span: SpanRecord) -> None:
    """Coerce every field; never raises. Rare, so clarity beats speed here."""
    _log.debug("span %r needed coercion while encoding", span.name)
    out.trace_id = id_bytes(span.trace_id, 16)
    out.span_id = id_bytes(span.span_id, 8)
    out.parent_span_id = id_bytes(span.parent_span_id, 8)
    out.trace_state = text(span.trace_state)
    out.name = text(span.name)
    out.kind = bounded_int(span.kind, 0, 5)
    out.start_time_unix_nano = bounded_int(span.start_ns, 0, UINT64_MAX)
    out.end_time_unix_nano = bounded_int(span.end_ns, 0, UINT64_MAX)
    fill_attributes_safely(out.attributes, span.attributes)
    if span.status_code or span.status_message:
        out.status.code = bounded_int(span.status_code, 0, 2)
        out.status.message = text(span.status_message)
    for link in iterable(span.links):
        trace_id, span_id = id_bytes(getattr(link, "trace_id", b""), 16), id_bytes(getattr(link, "span_id", b""), 8)
        if trace_id and span_id:
            out_link = out.links.add(trace_id=trace_id, span_id=span_id)
            fill_attributes_safely(out_link.attributes, getattr(link, "attributes", {}))
