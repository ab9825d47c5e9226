"""Trace context carried in request headers: W3C, Jaeger and B3.

When a request carries a trace header, the span the agent builds for it
joins that trace with that parent: propagated context wins over every
heuristic, so services instrumented with an OpenTelemetry or Jaeger SDK and
services that are not appear in one trace. Parsing uses the official
OpenTelemetry propagators (W3C in opentelemetry-api, Jaeger and B3 in their
propagator packages), tried in that order; only requests that carry one of
their headers pay for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from opentelemetry import trace
from opentelemetry.propagators.b3 import B3MultiFormat, B3SingleFormat
from opentelemetry.propagators.jaeger import JaegerPropagator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

#: (header that must be present, propagator, name) in order of precedence.
_PROPAGATORS = (
    ("traceparent", TraceContextTextMapPropagator(), "w3c"),
    ("uber-trace-id", JaegerPropagator(), "jaeger"),
    ("b3", B3SingleFormat(), "b3"),
    ("x-b3-traceid", B3MultiFormat(), "b3multi"),
)
#: A propagator only runs when its header is present.
_REQUIRED_HEADERS = tuple(header for header, _, _ in _PROPAGATORS)
_TRACE_HEADERS = frozenset(header for header, _, _ in _PROPAGATORS) | {"tracestate", "x-b3-spanid", "x-b3-sampled", "x-b3-parentspanid", "x-b3-flags"}


@dataclass(slots=True, frozen=True)
class RemoteParent:
    trace_id: bytes
    span_id: bytes
    trace_state: str
    format: str  # "w3c", "jaeger", "b3", "b3multi"


def extract_parent(headers: Iterable[tuple[str, str]]) -> RemoteParent | None:
    """The remote parent named by the request's headers (lower-cased names), if valid.

    Asked once per request, so a C function when compiled (propagation.pxd): what
    needs a comprehension (a closure, which a compiled cpdef function cannot
    hold) runs in the helpers below, for the requests that carry a header.

    ``headers`` is a sequence of pairs, or an object that also answers
    ``has_any(names)`` and ``get(name)`` (first value or None) without walking
    every field."""
    carrier: dict[str, str] | None = None
    has_any = getattr(headers, "has_any", None)
    if has_any is not None:
        # Fields kept as text and looked up by name (HTTP/1's FieldBlock): a few
        # searches instead of splitting every field into a pair.
        if not has_any(_REQUIRED_HEADERS):
            return None
        carrier = _trace_fields(headers)
    else:
        for name, value in headers:
            if name in _TRACE_HEADERS:
                if carrier is None:
                    carrier = {}
                carrier.setdefault(name, value)
    if carrier is None:
        return None
    return _parent_in(carrier)


def _parent_in(carrier: dict[str, str]) -> RemoteParent | None:
    """The first valid parent the propagators find in ``carrier``, in order of precedence."""
    for header, propagator, fmt in _PROPAGATORS:
        if header not in carrier:
            continue
        context = trace.get_current_span(propagator.extract(carrier)).get_span_context()
        if context.is_valid:
            state = ",".join(f"{k}={v}" for k, v in context.trace_state.items())
            return RemoteParent(context.trace_id.to_bytes(16, "big"), context.span_id.to_bytes(8, "big"), state, fmt)
    return None


def _trace_fields(headers) -> dict[str, str]:
    """The trace-context fields of headers looked up by name."""
    return {name: value for name in _TRACE_HEADERS if (value := headers.get(name)) is not None}
