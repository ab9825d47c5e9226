"""Protobuf wire helpers shared by every signal's encoder: varints, attributes, resources, scopes.

The signal encoders (``otelbpf.export.encode`` for spans,
``otelbpf.metrics.encode`` for metrics) write OTLP requests; what they have
in common lives here:

* ``varint`` and its table; ``Unusual``, raised by a fast path for a value it
  does not take (the caller then takes its message path);
* attributes as wire bytes (``wire_attributes``: one ``KeyValue`` per
  attribute, rendered by ``wire_key_value`` and cached per (key, value) in a
  ``FragmentCache``), exactly as upb serializes them;
* attributes into ``opentelemetry.proto`` messages: ``fill_attributes`` (the
  fast message path; raises for odd values) and ``fill_attributes_safely``
  (coerces anything: the careful path);
* ``resource_attributes`` (a ``ResourceLookup`` that never fails the
  export), ``wire_resource`` and ``wire_scope`` (a ``Resource`` and an
  ``InstrumentationScope`` field, tag 1 in both ``ResourceSpans`` and
  ``ResourceMetrics``);
* ``text``, ``id_bytes``, ``bounded_int``, ``iterable``: coercions for the
  careful paths.

Field tags used here (field number << 3 | wire type; 2 = length-delimited,
0 = varint, 1 = 64-bit):
  KeyValue.key 1 -> 0x0a, value 2 -> 0x12
  AnyValue.string_value 1 -> 0x0a, bool_value 2 -> 0x10, int_value 3 -> 0x18, double_value 4 -> 0x21
"""

from __future__ import annotations

import logging
import struct
from typing import Any, Callable, Mapping

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

import otelbpf
from otelbpf.core.model import ResourceLookup

_log = logging.getLogger(__name__)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UINT64_MAX = 2**64 - 1


class Unusual(Exception):
    """A field the fast path does not take: encode the record by the message path."""


def varint(number: int) -> bytes:
    """Base-128 varint of a non-negative number."""
    return VARINTS[number] if number < TABLE_SIZE else varint_computed(number)


def varint_computed(number: int) -> bytes:
    out = bytearray()
    while number > 0x7F:
        out.append((number & 0x7F) | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


TABLE_SIZE = 2048  # lengths below this (nearly all) take their varint from a table
VARINTS = [varint_computed(n) for n in range(TABLE_SIZE)]
FIXED64 = struct.Struct("<Q").pack
DOUBLE = struct.Struct("<d").pack


def wire_key_value(key: Any, value: Any) -> bytes:
    """``length + KeyValue`` (the repeated field's tag is the caller's) for a str/int/float/bool value."""
    key_field = _KEY_FIELDS.get(key) if type(key) is str else None
    if key_field is None:
        key_field = _key_field(key)
    kind = type(value)
    if kind is str:
        encoded = value.encode()
        length = len(encoded)
        if length < 0x7E and len(key_field) + length < 0x7C:  # every length fits one byte
            return VARINTS[len(key_field) + length + 4] + key_field + _STRING_VALUE_HEADS[length] + encoded
        any_value = b"\x0a" + varint(length) + encoded
    elif kind is int:
        if not INT64_MIN <= value <= INT64_MAX:
            raise Unusual  # the message path writes it as a string
        any_value = b"\x18" + varint(value & UINT64_MAX)  # negative: 10-byte two's complement
    elif kind is bool:
        any_value = b"\x10\x01" if value else b"\x10\x00"
    elif kind is float:
        any_value = b"\x21" + DOUBLE(value)
    else:
        raise Unusual
    body = key_field + b"\x12" + varint(len(any_value)) + any_value
    return varint(len(body)) + body


_KEY_FIELDS: dict[str, bytes] = {}
#: KeyValue.value's tag and length, then AnyValue.string_value's, for a string of n (< 0x7E) bytes.
_STRING_VALUE_HEADS = [bytes((0x12, length + 2, 0x0a, length)) for length in range(0x7E)]


def _key_field(key: Any) -> bytes:
    """``KeyValue.key`` (nothing for an empty key, as upb writes it); raises unless a valid str."""
    if type(key) is not str:
        raise Unusual
    encoded = key.encode()
    field = b"\x0a" + varint(len(encoded)) + encoded if encoded else b""
    if len(_KEY_FIELDS) < 4096:
        _KEY_FIELDS[key] = field
    return field


class FragmentCache:
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
        strings, ints = self.strings, self.ints
        for key, value in attributes.items():
            values = strings.get(key)
            if values is None:
                values = _NOTHING  # still hashes the value: an unhashable one raises, as it always did
            fragment = values.get(value)
            if fragment is None:
                if type(value) is int:
                    values = ints.get(key)
                    if values is not None:
                        fragment = values.get(value)
                if fragment is None:
                    fragment = self.miss(key, value)
            fragments.append(fragment)
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


_NOTHING: dict[Any, Any] = {}

#: The wire encoders' attribute cache (module-level so that tests and benchmarks can swap or clear it).
WIRE_CACHE = FragmentCache(wire_key_value)


def wire_attributes(attributes: Mapping[str, Any], tag: bytes) -> bytes:
    """The repeated ``KeyValue`` field ``tag`` for ``attributes``; raises for any value the fast path does not take."""
    # the leading b"" makes the join put the tag before every fragment
    cache = WIRE_CACHE  # read per call (tests swap it); typed when compiled, so fragments() is a C call
    return tag.join(cache.fragments(attributes, [b""]))


def resource_attributes(resources: ResourceLookup, pid: int) -> Mapping[str, Any]:
    """The process's resource attributes; none (logged) if the lookup fails, so the data still goes out."""
    try:
        return resources.attributes(pid)
    except Exception as exc:  # noqa: BLE001 - a lookup bug must not lose the data
        _log.warning("resource lookup failed for pid %s (%s); exporting without resource attributes", pid, exc)
        return {}


def wire_resource(attributes: Mapping[str, Any]) -> bytes:
    """The ``resource`` field (tag 1) of a ``Resource{Spans,Metrics}``, or nothing when there are no attributes."""
    try:
        body = wire_attributes(attributes, b"\x0a")
    except Exception:  # noqa: BLE001 - odd values: coerced
        message = Resource()
        fill_attributes_safely(message.attributes, attributes)
        body = message.SerializeToString()
    return b"\x0a" + varint(len(body)) + body if body else b""


_SCOPE_FIELDS: dict[str, bytes] = {}


def wire_scope(scope: Any) -> bytes:
    """The ``scope`` field (tag 1) of a ``Scope{Spans,Metrics}``: the name, versioned with the agent (always present)."""
    field = _SCOPE_FIELDS.get(scope) if type(scope) is str else None
    if field is None:
        body = InstrumentationScope(name=text(scope), version=otelbpf.__version__).SerializeToString()
        field = b"\x0a" + varint(len(body)) + body
        if type(scope) is str and len(_SCOPE_FIELDS) < 1024:
            _SCOPE_FIELDS[scope] = field
    return field


# --- attributes into messages ----------------------------------------------------


def fill_attributes(out: Any, attributes: Mapping[str, Any]) -> None:
    """Typed AnyValues into a repeated ``KeyValue`` field; exact ``type`` checks put bool before int for free.
    Raises for text protobuf refuses (lone surrogates); other odd values are coerced."""
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
            add_coerced_attribute(out, key, value)


def fill_attributes_safely(out: Any, attributes: Any) -> None:
    """``fill_attributes`` for anything: every key and value coerced; never raises."""
    try:
        items = list(attributes.items())
    except Exception:  # noqa: BLE001 - not a mapping: nothing usable
        return
    for key, value in items:
        add_coerced_attribute(out, key, value)


def fill_attributes_checked(out: Any, attributes: Mapping[str, Any]) -> None:
    """``fill_attributes``, redone by ``fill_attributes_safely`` if a value trips it (e.g. invalid UTF-8)."""
    try:
        fill_attributes(out, attributes)
    except Exception:  # noqa: BLE001
        del out[:]
        fill_attributes_safely(out, attributes)


def add_coerced_attribute(out: Any, key: Any, value: Any) -> None:
    """Append ``key=value`` with the closest OTLP type; ``None`` is left out."""
    if value is None:
        return
    out.append(KeyValue(key=text(key), value=coerce_any_value(value)))


def coerce_any_value(value: Any, depth: int = 0) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        if INT64_MIN <= value <= INT64_MAX:
            return AnyValue(int_value=int(value))
        return AnyValue(string_value=str(int(value)))
    if isinstance(value, float):
        return AnyValue(double_value=float(value))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return AnyValue(bytes_value=bytes(value))
    if isinstance(value, (list, tuple)) and depth < 4:
        array = AnyValue()
        array.array_value.values.extend(coerce_any_value(item, depth + 1) for item in value if item is not None)
        return array
    return AnyValue(string_value=text(value))


# --- coercions for the careful paths -----------------------------------------------


def text(value: Any) -> str:
    """A str protobuf accepts: lone surrogates (from undecodable bytes) become U+FFFD."""
    result = value if isinstance(value, str) else str(value)
    try:
        result.encode("utf-8")
        return str(result)
    except UnicodeEncodeError:
        pass
    try:  # bytes smuggled in by surrogateescape decoding: back to bytes, then U+FFFD for the bad ones
        return result.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:
        return result.encode("utf-8", "replace").decode("utf-8")


def id_bytes(value: Any, size: int) -> bytes:
    """The id if it has the right size, else empty (which collectors accept, unlike a wrong size)."""
    if isinstance(value, (bytes, bytearray, memoryview)) and len(value) == size:
        return bytes(value)
    return b""


def bounded_int(value: Any, low: int, high: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return low
    return min(max(number, low), high)


def iterable(value: Any) -> list[Any]:
    try:
        return list(value)
    except TypeError:
        return []
