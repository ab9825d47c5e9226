"""Metric instruments as data: what to measure from finished spans.

A protocol declares its instruments in its own definitions module
(``otelbpf/metrics/http1.py`` for HTTP/1.x) and registers them with the
protocol (``otelbpf/registry.py``). The aggregator and the OTLP metric
encoder iterate over these definitions; neither names a protocol.

A :class:`SpanHistogram` is fed every finished span of its protocol that its
``select`` accepts; it records ``value(span)`` (seconds of duration unless
said otherwise) with the span attributes named in ``attributes`` as the data
point's attributes (absent ones left out). Attribute lists must stay
low-cardinality: never a path, a full URL or a peer address.

``fixed_attributes`` are added to every data point of an instrument as they
are: two definitions with the same name can then split one metric by a
dimension that is not a span attribute (``gen_ai.client.token.usage`` is
recorded once with ``gen_ai.token.type=input`` and once with ``output``,
from two values of one span).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from otelbpf.core.model import AttributeValue, SpanKind, SpanRecord


def duration_seconds(span: SpanRecord) -> float:
    """The span's duration in seconds (0 for a span that ends before it starts)."""
    duration = (span.end_ns - span.start_ns) / 1e9
    return duration if duration > 0.0 else 0.0


def of_kind(kind: SpanKind) -> Callable[[SpanRecord], bool]:
    """A selector for spans of one kind."""

    def select(span: SpanRecord) -> bool:
        return span.kind == kind

    select.__name__ = f"kind_is_{kind.name.lower()}"
    #: Lets SpanMetrics sort instruments by kind once, instead of calling select per span.
    select.kind = kind
    return select


@dataclass(frozen=True, slots=True)
class SpanHistogram:
    """An explicit-bucket histogram fed by finished spans."""

    name: str
    unit: str
    description: str
    #: Bucket ``i`` counts values ``<= boundaries[i]``; one more bucket holds the rest.
    boundaries: tuple[float, ...]
    #: Span attribute keys copied onto the data point, in this order.
    attributes: tuple[str, ...]
    #: Which spans of the protocol this instrument measures.
    select: Callable[[SpanRecord], bool]
    #: What it measures of a selected span.
    value: Callable[[SpanRecord], float] = duration_seconds
    #: (key, value) pairs added to every data point (see the module docstring).
    fixed_attributes: tuple[tuple[str, AttributeValue], ...] = ()
    #: A span attribute every span it selects carries (or ""): spans without it
    #: are not offered to ``select`` at all, so that instruments for a kind of
    #: span few are (LLM calls among HTTP requests) cost the others one lookup.
    requires: str = ""
    #: A span attribute no span it measures carries (or ""): spans with it are not
    #: offered to ``select`` (HTTP/2's HTTP instruments leave gRPC calls to the RPC ones),
    #: so that ``select`` can stay a plain kind test (``of_kind``), decided without a call.
    excludes: str = ""
