"""HTTP/1.x metric instruments, per the HTTP metrics semantic conventions.

``http.server.request.duration`` for SERVER spans and
``http.client.request.duration`` for CLIENT spans, in seconds, with the
advised bucket boundaries. ``server.address``/``server.port`` are opt-in for
server metrics and left out; ``url.path``, ``url.full`` and peer addresses
never become metric attributes (unbounded cardinality).
"""

from __future__ import annotations

from otelbpf import semconv as sc
from otelbpf.core.model import SpanKind
from otelbpf.metrics.instruments import SpanHistogram, of_kind

SERVER_ATTRIBUTES: tuple[str, ...] = (
    sc.HTTP_REQUEST_METHOD,
    sc.HTTP_RESPONSE_STATUS_CODE,
    sc.HTTP_ROUTE,
    sc.ERROR_TYPE,
    sc.NETWORK_PROTOCOL_NAME,
    sc.NETWORK_PROTOCOL_VERSION,
    sc.URL_SCHEME,
)
CLIENT_ATTRIBUTES: tuple[str, ...] = (
    sc.HTTP_REQUEST_METHOD,
    sc.HTTP_RESPONSE_STATUS_CODE,
    sc.ERROR_TYPE,
    sc.NETWORK_PROTOCOL_NAME,
    sc.NETWORK_PROTOCOL_VERSION,
    sc.SERVER_ADDRESS,
    sc.SERVER_PORT,
    sc.URL_SCHEME,
)

SERVER_DURATION = SpanHistogram(
    name=sc.HTTP_SERVER_REQUEST_DURATION,
    unit="s",
    description="Duration of HTTP server requests.",
    boundaries=sc.HTTP_DURATION_BOUNDARIES,
    attributes=SERVER_ATTRIBUTES,
    select=of_kind(SpanKind.SERVER),
)
CLIENT_DURATION = SpanHistogram(
    name=sc.HTTP_CLIENT_REQUEST_DURATION,
    unit="s",
    description="Duration of HTTP client requests.",
    boundaries=sc.HTTP_DURATION_BOUNDARIES,
    attributes=CLIENT_ATTRIBUTES,
    select=of_kind(SpanKind.CLIENT),
)

INSTRUMENTS: tuple[SpanHistogram, ...] = (SERVER_DURATION, CLIENT_DURATION)
