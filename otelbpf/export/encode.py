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
  (``_FragmentCache``), since most attributes of a span repeat across
  requests (method, scheme, route, peer address, status code, ...);
* nested lengths (``ScopeSpans``, ``ResourceSpans``) are added up as the
  parts are appended to one flat list, joined once at the end: no
  intermediate copies of large buffers.

``encode_request`` parses those bytes back into a message, for callers that
want one; the OTLP sinks send the bytes as they are (``SpanBatch.payload``).

Grouping follows OTLP: one ``ResourceSpans`` per process (``pid``), with the
resource attributes from a ``ResourceLookup``, and inside it one
``ScopeSpans`` per instrumentation scope (the protocol that produced the
span), versioned with the agent's version; both in order of first appearance.

Bad field contents never raise. The fast path only takes what it knows: ids
of the right size, exact ``str``/``int``/``float``/``bool`` values in range,
known kinds and status codes. Any other span is encoded by the message path
it replaced (``_span_message``: fill a ``Span`` message, and if a field trips
it, rebuild it by the careful path that coerces each field), so odd records
come out exactly as they always did. Links with malformed ids are left out,
since a collector rejects a whole request over one. (The records themselves,
with their own ids, pid and scope, are checked once by the
BatchSpanProcessor's ``on_end``.)
"""

from __future__ import annotations

import logging
import struct
from typing import Any, Callable, Mapping, Sequence

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

import otelbpf
from otelbpf.model import ResourceLookup, SpanRecord

_log = logging.getLogger(__name__)

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_UINT64_MAX = 2**64 - 1


def encode_request(spans: Sequence[SpanRecord], resources: ResourceLookup) -> ExportTraceServiceRequest:
    """Build one OTLP trace request for ``spans``, grouped by process and scope."""
    return ExportTraceServiceRequest.FromString(serialize_request(spans, resources))


def serialize_request(spans: Sequence[SpanRecord], resources: ResourceLookup) -> bytes:
    """``encode_request(spans, resources).SerializeToString()``, written directly (the fast path)."""
    out: list[bytes] = []
    append = out.append
    for pid, by_scope in group_spans(spans).items():
        resource_spans_at = len(out)
        append(b"")  # the ResourceSpans tag and length, once known
        resource = _wire_resource(resources, pid)
        size = len(resource)
        append(resource)
        for scope, records in by_scope.items():
            scope_spans_at = len(out)
            append(b"")  # the ScopeSpans tag and length
            scope_field = _wire_scope(scope)
            append(scope_field)
            scope_size = len(scope_field)
            for span in records:
                try:
                    body = _wire_span(span)
                except Exception:  # noqa: BLE001 - anything unusual: the message path, as before
                    body = _span_message(span).SerializeToString()
                length = len(body)
                head = _SPAN_HEADS[length] if length < _TABLE_SIZE else b"\x12" + _varint(length)
                append(head)
                append(body)
                scope_size += len(head) + length
            out[scope_spans_at] = head = b"\x12" + _varint(scope_size)
            size += len(head) + scope_size
        out[resource_spans_at] = b"\x0a" + _varint(size)
    return b"".join(out)


def group_spans(spans: Sequence[SpanRecord]) -> dict[Any, dict[Any, list[SpanRecord]]]:
    """pid -> scope -> spans, each in order of first appearance (the request's layout)."""
    groups: dict[Any, dict[Any, list[SpanRecord]]] = {}
    for span in spans:
        by_scope = groups.get(span.pid)
        if by_scope is None:
            by_scope = groups[span.pid] = {}
        records = by_scope.get(span.scope)
        if records is None:
            by_scope[span.scope] = [span]
        else:
            records.append(span)
    return groups


def resource_attributes(resources: ResourceLookup, pid: int) -> Mapping[str, Any]:
    """The process's resource attributes; none (logged) if the lookup fails, so the spans still go out."""
    try:
        return resources.attributes(pid)
    except Exception as exc:  # noqa: BLE001 - a lookup bug must not lose the spans
        _log.warning("resource lookup failed for pid %s (%s); exporting without resource attributes", pid, exc)
        return {}


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


class _Unusual(Exception):
    """A field the fast path does not take: encode the span by the message path."""


def _varint(number: int) -> bytes:
    """Base-128 varint of a non-negative number."""
    return _VARINTS[number] if number < _TABLE_SIZE else _varint_computed(number)


def _varint_computed(number: int) -> bytes:
    out = bytearray()
    while number > 0x7F:
        out.append((number & 0x7F) | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


_TABLE_SIZE = 2048  # lengths below this (nearly all) take their varint from a table
_VARINTS = [_varint_computed(n) for n in range(_TABLE_SIZE)]
_SPAN_HEADS = [b"\x12" + prefix for prefix in _VARINTS]  # ScopeSpans.spans tag + length

_KIND_FIELDS = {0: b"", **{kind: bytes((0x30, kind)) for kind in range(1, 6)}}
_STATUS_CODE_FIELDS = {0: b"", 1: b"\x18\x01", 2: b"\x18\x02"}
_TIMES = struct.Struct("<BQBQ").pack  # start and end time with their tags (fixed64, little-endian)
_FIXED64 = struct.Struct("<Q").pack
_DOUBLE = struct.Struct("<d").pack


def _wire_span(span: SpanRecord) -> bytes:
    """A well-typed span's ``Span`` message bytes; raises for anything else."""
    trace_id, span_id = span.trace_id, span.span_id
    if type(trace_id) is not bytes or len(trace_id) != 16 or type(span_id) is not bytes or len(span_id) != 8:
        raise _Unusual
    parts = [b"\x0a\x10", trace_id, b"\x12\x08", span_id]
    trace_state = span.trace_state
    if trace_state:
        if type(trace_state) is not str:
            raise _Unusual
        encoded = trace_state.encode()
        parts += (b"\x1a" + _varint(len(encoded)), encoded)
    parent = span.parent_span_id
    if parent:
        if type(parent) is not bytes or len(parent) != 8:
            raise _Unusual
        parts += (b"\x22\x08", parent)
    name = span.name
    if type(name) is not str:
        raise _Unusual
    if name:
        encoded = name.encode()
        parts += (b"\x2a" + _varint(len(encoded)), encoded)
    parts.append(_KIND_FIELDS[span.kind])
    start, end = span.start_ns, span.end_ns
    if start and end:
        parts.append(_TIMES(0x39, start, 0x41, end))  # struct.error unless both are ints in uint64 range
    else:
        parts.append(_wire_times(start, end))
    attributes = span.attributes
    if attributes:
        parts.append(_wire_attributes(attributes, b"\x4a"))
    links = span.links
    if links:
        for link in links:
            link_trace_id, link_span_id = link.trace_id, link.span_id
            if type(link_trace_id) is not bytes or type(link_span_id) is not bytes:
                raise _Unusual
            if len(link_trace_id) != 16 or len(link_span_id) != 8:
                continue  # a collector rejects the whole request over one malformed id
            body = b"\x0a\x10" + link_trace_id + b"\x12\x08" + link_span_id
            if link.attributes:
                body += _wire_attributes(link.attributes, b"\x22")
            parts += (b"\x6a" + _varint(len(body)), body)
    code, message = span.status_code, span.status_message
    if code or message:
        if type(message) is not str:
            raise _Unusual
        encoded = message.encode()
        status = (b"\x12" + _varint(len(encoded)) + encoded if encoded else b"") + _STATUS_CODE_FIELDS[code]
        parts += (b"\x7a" + _varint(len(status)), status)
    return b"".join(parts)


def _wire_times(start: Any, end: Any) -> bytes:
    """Start and end when one of them is zero (a zero fixed64 is left out, as upb does)."""
    out = b""
    for tag, value in ((0x39, start), (0x41, end)):
        if type(value) is not int:
            raise _Unusual
        if value:
            out += bytes((tag,)) + _FIXED64(value)
    return out


def _wire_key_value(key: Any, value: Any) -> bytes:
    """``length + KeyValue`` (the repeated field's tag is the caller's) for a str/int/float/bool value."""
    key_field = _KEY_FIELDS.get(key) if type(key) is str else None
    if key_field is None:
        key_field = _key_field(key)
    kind = type(value)
    if kind is str:
        encoded = value.encode()
        length = len(encoded)
        if length < 0x7E and len(key_field) + length < 0x7C:  # every length fits one byte
            return _VARINTS[len(key_field) + length + 4] + key_field + _STRING_VALUE_HEADS[length] + encoded
        any_value = b"\x0a" + _varint(length) + encoded
    elif kind is int:
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise _Unusual  # the message path writes it as a string
        any_value = b"\x18" + _varint(value & _UINT64_MAX)  # negative: 10-byte two's complement
    elif kind is bool:
        any_value = b"\x10\x01" if value else b"\x10\x00"
    elif kind is float:
        any_value = b"\x21" + _DOUBLE(value)
    else:
        raise _Unusual
    body = key_field + b"\x12" + _varint(len(any_value)) + any_value
    return _varint(len(body)) + body


_KEY_FIELDS: dict[str, bytes] = {}
#: KeyValue.value's tag and length, then AnyValue.string_value's, for a string of n (< 0x7E) bytes.
_STRING_VALUE_HEADS = [bytes((0x12, length + 2, 0x0a, length)) for length in range(0x7E)]


def _key_field(key: Any) -> bytes:
    """``KeyValue.key`` (nothing for an empty key, as upb writes it); raises unless a valid str."""
    if type(key) is not str:
        raise _Unusual
    encoded = key.encode()
    field = b"\x0a" + _varint(len(encoded)) + encoded if encoded else b""
    if len(_KEY_FIELDS) < 4096:
        _KEY_FIELDS[key] = field
    return field


class _FragmentCache:
    """Rendered attributes (``render(key, value)``) by key, then value, for str and int values.

    Two tables, so that a lookup needs no type check: a value found in
    ``strings`` (only str values there) is a str; ``ints`` is only consulted
    for exact ints, because ``True == 1 == 1.0`` would find an int's entry
    for a bool or a float (those are rendered every time; they are rare and
    cheap). The encoders' loops read the tables directly; only a miss calls
    ``miss``.

    Bounded: at most ``total`` entries, and ``per_key`` per key. A key that
    has filled its share (a URL path with ids, a peer port) keeps the values
    it has and the rest are rendered each time; after ``total`` such misses,
    or when ``total`` is reached, it all starts over, so values that became
    common later get in. Long strings are never kept. Safe to share between
    threads: an entry is a pure function of its key and value, and a race
    can at worst lose one.
    """

    def __init__(
        self, render: Callable[[Any, Any], Any], *, per_key: int = 512, total: int = 8192, max_len: int = 256
    ) -> None:
        self.strings: dict[Any, dict[str, Any]] = {}
        self.ints: dict[Any, dict[int, Any]] = {}
        self._render = render
        self._per_key = per_key
        self._total = total
        self._max_len = max_len
        self._size = 0
        self._overflows = 0

    def fragments(self, attributes: Mapping[str, Any], fragments: list) -> list:
        """Append the rendering of every attribute to ``fragments`` (cached
        where possible); raises for any value the fast path does not take."""
        strings, ints, miss = self.strings, self.ints, self.miss
        append = fragments.append
        for key, value in attributes.items():
            fragment = (strings.get(key) or _NOTHING).get(value)
            if fragment is None:
                if type(value) is int:
                    fragment = (ints.get(key) or _NOTHING).get(value)
                if fragment is None:
                    fragment = miss(key, value)
            append(fragment)
        return fragments

    def miss(self, key: Any, value: Any) -> Any:
        fragment = self._render(key, value)  # raises for what the fast path does not take
        kind = type(value)
        if kind is str:
            if len(value) > self._max_len:
                return fragment
            table: dict[Any, dict[Any, Any]] = self.strings
        elif kind is int:
            table = self.ints
        else:
            return fragment
        values = table.get(key)
        if values is not None and len(values) >= self._per_key:
            self._overflows += 1
            if self._overflows < self._total:
                return fragment
            self.clear()
            values = None
        if self._size >= self._total:
            self.clear()
            values = None
        if values is None:
            values = table[key] = {}
        values[value] = fragment
        self._size += 1
        return fragment

    def clear(self) -> None:
        self.strings.clear()
        self.ints.clear()
        self._size = self._overflows = 0


_WIRE_CACHE = _FragmentCache(_wire_key_value)


_NOTHING: dict[Any, Any] = {}


def _wire_attributes(attributes: Mapping[str, Any], tag: bytes) -> bytes:
    """The repeated ``KeyValue`` field ``tag`` for ``attributes``; raises for any value the fast path does not take."""
    # the leading b"" makes the join put the tag before every fragment
    return tag.join(_WIRE_CACHE.fragments(attributes, [b""]))


def _wire_resource(resources: ResourceLookup, pid: int) -> bytes:
    """The ``ResourceSpans.resource`` field, or nothing when there are no attributes (as before)."""
    attributes = resource_attributes(resources, pid)
    try:
        body = _wire_attributes(attributes, b"\x0a")
    except Exception:  # noqa: BLE001 - odd values: coerced, as before
        message = Resource()
        _fill_attributes_safely(message.attributes, attributes)
        body = message.SerializeToString()
    return b"\x0a" + _varint(len(body)) + body if body else b""


_SCOPE_FIELDS: dict[str, bytes] = {}


def _wire_scope(scope: Any) -> bytes:
    """The ``ScopeSpans.scope`` field: the scope name, versioned with the agent (always present, as before)."""
    field = _SCOPE_FIELDS.get(scope) if type(scope) is str else None
    if field is None:
        body = InstrumentationScope(name=_text(scope), version=otelbpf.__version__).SerializeToString()
        field = b"\x0a" + _varint(len(body)) + body
        if type(scope) is str and len(_SCOPE_FIELDS) < 1024:
            _SCOPE_FIELDS[scope] = field
    return field


# --- the message path: the reference, and the fallback for unusual spans -----


def _span_message(span: SpanRecord) -> Span:
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
        _fill_attributes_safely(resource_spans.resource.attributes, resource_attributes(resources, pid))
        for scope, records in by_scope.items():
            scope_spans: ScopeSpans = resource_spans.scope_spans.add()
            scope_spans.scope.name = _text(scope)
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
