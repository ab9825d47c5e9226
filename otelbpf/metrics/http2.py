"""HTTP/2 metric instruments: RPC durations for gRPC calls (RPC metric
conventions v1.44), HTTP durations for the rest (as HTTP/1's).

``rpc.server.call.duration`` / ``rpc.client.call.duration`` in seconds with
the advised boundaries and the conventions' attributes (``server.address``
and ``server.port`` are opt-in there and left out). A span is a gRPC call
when it has ``rpc.system.name`` (the RPC instruments' ``requires``); HTTP
instruments take the others (their ``excludes``). The selectors are kind tests,
so SpanMetrics sorts the instruments by kind once and calls nothing per span.
"""

from __future__ import annotations

from otelbpf import semconv as sc
from otelbpf.core.model import SpanKind
from otelbpf.metrics import http1 as http1_metrics
from otelbpf.metrics.instruments import SpanHistogram, of_kind

RPC_ATTRIBUTES: tuple[str, ...] = (
    sc.RPC_SYSTEM_NAME,
    sc.RPC_METHOD,
    sc.RPC_RESPONSE_STATUS_CODE,
    sc.ERROR_TYPE,
)


RPC_SERVER_DURATION = SpanHistogram(
    name=sc.RPC_SERVER_CALL_DURATION,
    unit="s",
    description="Measures the duration of an incoming Remote Procedure Call (RPC).",
    boundaries=sc.RPC_DURATION_BOUNDARIES,
    attributes=RPC_ATTRIBUTES,
    select=of_kind(SpanKind.SERVER),
    requires=sc.RPC_SYSTEM_NAME,  # gRPC calls only
)
RPC_CLIENT_DURATION = SpanHistogram(
    name=sc.RPC_CLIENT_CALL_DURATION,
    unit="s",
    description="Measures the duration of an outgoing Remote Procedure Call (RPC).",
    boundaries=sc.RPC_DURATION_BOUNDARIES,
    attributes=RPC_ATTRIBUTES,
    select=of_kind(SpanKind.CLIENT),
    requires=sc.RPC_SYSTEM_NAME,  # gRPC calls only
)
HTTP_SERVER_DURATION = SpanHistogram(
    name=sc.HTTP_SERVER_REQUEST_DURATION,
    unit="s",
    description="Duration of HTTP server requests.",
    boundaries=sc.HTTP_DURATION_BOUNDARIES,
    attributes=http1_metrics.SERVER_ATTRIBUTES,
    select=of_kind(SpanKind.SERVER),
    excludes=sc.RPC_SYSTEM_NAME,  # not gRPC calls
)
HTTP_CLIENT_DURATION = SpanHistogram(
    name=sc.HTTP_CLIENT_REQUEST_DURATION,
    unit="s",
    description="Duration of HTTP client requests.",
    boundaries=sc.HTTP_DURATION_BOUNDARIES,
    attributes=http1_metrics.CLIENT_ATTRIBUTES,
    select=of_kind(SpanKind.CLIENT),
    excludes=sc.RPC_SYSTEM_NAME,  # not gRPC calls
)

INSTRUMENTS: tuple[SpanHistogram, ...] = (
    RPC_SERVER_DURATION,
    RPC_CLIENT_DURATION,
    HTTP_SERVER_DURATION,
    HTTP_CLIENT_DURATION,
)
