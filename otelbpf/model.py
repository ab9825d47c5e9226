"""The agent's own span record: cheap to build, encoded straight to OTLP.

The OpenTelemetry SDK span API costs ~17 us per span (docs/architecture.md,
"Measured costs"), so
the per-request path builds these plain records instead and
``otelbpf.export.encode`` writes them directly into ``opentelemetry.proto``
messages. Field meanings follow OTLP's ``Span`` message.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field
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


@dataclass(slots=True)
class SpanLink:
    trace_id: bytes
    span_id: bytes
    attributes: dict[str, AttributeValue] = field(default_factory=dict)


@dataclass(slots=True)
class SpanRecord:
    trace_id: bytes  # 16 bytes
    span_id: bytes  # 8 bytes
    name: str
    kind: SpanKind
    start_ns: int  # unix epoch nanoseconds
    end_ns: int
    #: Key of the process this span belongs to; the exporter turns it into a
    #: Resource through a ResourceRegistry.
    pid: int
    parent_span_id: bytes = b""  # empty for a root span
    attributes: dict[str, AttributeValue] = field(default_factory=dict)
    status_code: StatusCode = StatusCode.UNSET
    status_message: str = ""
    trace_state: str = ""
    links: list[SpanLink] = field(default_factory=list)
    #: Instrumentation scope name for the protocol that produced it.
    scope: str = "otelbpf"
    #: Protocol id (``protocols/<id>``) that produced it: selects its metric
    #: instruments (otelbpf/registry.py). Not exported as such.
    protocol: str = ""


def new_trace_id() -> bytes:
    """A random non-zero trace ID (like the SDK's RandomIdGenerator)."""
    return (random.getrandbits(128) or 1).to_bytes(16, "big")


def new_span_id() -> bytes:
    return (random.getrandbits(64) or 1).to_bytes(8, "big")


class ResourceLookup:
    """Maps a span's ``pid`` to its resource attributes (see otelbpf.resources)."""

    def attributes(self, pid: int) -> Mapping[str, AttributeValue]:  # pragma: no cover - interface
        raise NotImplementedError
