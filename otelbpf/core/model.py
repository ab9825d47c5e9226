"""The agent's own span record: cheap to build, encoded straight to OTLP.

The OpenTelemetry SDK span API costs ~17 us per span (docs/architecture.md,
"Measured costs"), so
the per-request path builds these plain records instead and
``otelbpf.export.encode`` writes them directly into ``opentelemetry.proto``
messages. Field meanings follow OTLP's ``Span`` message.
"""

from __future__ import annotations

import enum
import os
import random
from dataclasses import dataclass
from typing import Mapping, Union

AttributeValue = Union[str, bool, int, float]


class SpanKind(enum.IntEnum):
    """Same numbers as OTLP's ``Span.SpanKind``."""

    INTERNAL = 1
    SERVER = 2
    CLIENT = 3
    PRODUCER = 4
    CONSUMER = 5


class StatusCode(enum.IntEnum):
    """Same numbers as OTLP's ``Status.StatusCode``."""

    UNSET = 0
    OK = 1
    ERROR = 2


# SpanLink and SpanRecord are built per request. Written as a dataclass over an
# explicit ``__init__`` and ``__slots__`` (fields as bare annotations, defaults in
# ``__init__``; ``None`` stands for a fresh empty dict or list), they stay slotted
# dataclasses as plain Python and become extension types with a C ``__init__`` when
# Cython compiles this module (model.pxd declares their fields).


@dataclass
class SpanLink:
    __slots__ = ("trace_id", "span_id", "attributes")
    trace_id: bytes
    span_id: bytes
    attributes: dict[str, AttributeValue]

    def __init__(self, trace_id, span_id, attributes=None) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.attributes = {} if attributes is None else attributes


@dataclass
class SpanRecord:
    __slots__ = ("trace_id", "span_id", "name", "kind", "start_ns", "end_ns", "pid", "parent_span_id",
                 "attributes", "status_code", "status_message", "trace_state", "links", "scope", "protocol")
    trace_id: bytes  # 16 bytes
    span_id: bytes  # 8 bytes
    name: str
    kind: SpanKind
    start_ns: int  # unix epoch nanoseconds
    end_ns: int
    #: Key of the process this span belongs to; the exporter turns it into a
    #: Resource through a ResourceRegistry.
    pid: int
    parent_span_id: bytes  # empty for a root span
    attributes: dict[str, AttributeValue]
    status_code: StatusCode
    status_message: str
    trace_state: str
    links: list[SpanLink]
    #: Instrumentation scope name for the protocol that produced it.
    scope: str
    #: Protocol id (``protocols/<id>``) that produced it: selects its metric
    #: instruments (otelbpf/registry.py). Not exported as such.
    protocol: str

    def __init__(self, trace_id, span_id, name, kind, start_ns, end_ns, pid, parent_span_id=b"",
                 attributes=None, status_code=StatusCode.UNSET, status_message="", trace_state="",
                 links=None, scope="otelbpf", protocol="") -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.name = name
        self.kind = kind
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.pid = pid
        self.parent_span_id = parent_span_id
        self.attributes = {} if attributes is None else attributes
        self.status_code = status_code
        self.status_message = status_message
        self.trace_state = trace_state
        self.links = [] if links is None else links
        self.scope = scope
        self.protocol = protocol


def new_trace_id() -> bytes:
    """A random non-zero trace ID (random bits, like the SDK's RandomIdGenerator)."""
    return _draw(_TRACE_IDS, 16, _ZERO_TRACE_ID, _ONE_TRACE_ID)


def new_span_id() -> bytes:
    """A random non-zero span ID."""
    return _draw(_SPAN_IDS, 8, _ZERO_SPAN_ID, _ONE_SPAN_ID)


def _draw(pool: list, size: int, zero: bytes, one: bytes) -> bytes:
    try:
        drawn = pool.pop()
    except IndexError:
        pool.extend(_random_ids(size))
        drawn = pool.pop()
    return drawn if drawn != zero else one


# IDs are cut from 4 KiB of random bits at a time: one draw per 256 or 512 IDs
# instead of one (and a conversion to bytes) per ID, two of which every request
# needs. list.pop() is atomic, so threads never share an ID; a forked child
# starts with empty pools (its parent's IDs stay its parent's).
_ID_BLOCK = 4096
_TRACE_IDS: list[bytes] = []
_SPAN_IDS: list[bytes] = []
_ZERO_TRACE_ID, _ONE_TRACE_ID = bytes(16), (1).to_bytes(16, "big")
_ZERO_SPAN_ID, _ONE_SPAN_ID = bytes(8), (1).to_bytes(8, "big")


def _random_ids(size: int) -> list[bytes]:
    block = random.getrandbits(8 * _ID_BLOCK).to_bytes(_ID_BLOCK, "big")
    return [block[i : i + size] for i in range(0, _ID_BLOCK, size)]


def _empty_id_pools() -> None:
    _TRACE_IDS.clear()
    _SPAN_IDS.clear()


os.register_at_fork(after_in_child=_empty_id_pools)


class ResourceLookup:
    """Maps a span's ``pid`` to its resource attributes (see otelbpf.host.resources)."""

    def attributes(self, pid: int) -> Mapping[str, AttributeValue]:  # pragma: no cover - interface
        raise NotImplementedError
