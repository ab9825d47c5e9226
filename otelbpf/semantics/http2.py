"""Where an HTTP/2 stream becomes a span: a gRPC span (``semantics/grpc.py``)
when it carries gRPC, otherwise an HTTP span by the HTTP conventions, with
``network.protocol.version`` = ``2``.

Both mark what the wire could not tell: ``otelbpf.http2.hpack_incomplete``
when some header field referred to an HPACK entry older than the agent
(docs/http2.md). Names and private-by-default rules are HTTP/1's
(``semantics/http1.py``): no query string, no header values but
``user-agent`` and the authority, unless the user opts in.
"""

from __future__ import annotations

from otelbpf.core.association import pair_key
from otelbpf.core.identity import SpanStart
from otelbpf.core.model import AttributeValue, SpanKind, SpanRecord, StatusCode
from otelbpf.semantics.common import (
    SpanOptions,
    http_request_extras,
    http_response_status,
    network_transport,
    outcome_status,
    peer_attributes,
    span_record,
)
from otelbpf.semantics.grpc import PeerMethods, emit_deprecated_names, grpc_attributes, is_grpc
from otelbpf.semantics.http1 import derive_route, split_host, split_target
from otelbpf.semconv import (
    CLIENT_ADDRESS,
    CLIENT_PORT,
    HTTP_KNOWN_METHODS,
    HTTP_OTHER_METHOD,
    HTTP_REQUEST_METHOD,
    HTTP_REQUEST_METHOD_ORIGINAL,
    HTTP_RESPONSE_BODY_SIZE,
    HTTP_ROUTE,
    NETWORK_PROTOCOL_NAME,
    NETWORK_PROTOCOL_VERSION,
    OTELBPF_HTTP2_HPACK_INCOMPLETE,
    OTELBPF_HTTP2_RESET_CODE,
    OTELBPF_HTTP2_UPGRADED,
    OTELBPF_PAYLOAD_TRUNCATED,
    SERVER_ADDRESS,
    SERVER_PORT,
    URL_FULL,
    URL_PATH,
    URL_QUERY,
    URL_SCHEME,
)
from protocols.http2.types import PROTOCOL, Http2Exchange


class Http2Semantics:
    """``SpanSemantics`` for HTTP/2 (protocols/http2), gRPC included."""

    protocol = PROTOCOL

    def __init__(self, rpc_dup: bool | None = None) -> None:
        #: Also write the deprecated RPC names (``OTEL_SEMCONV_STABILITY_OPT_IN=rpc/dup``).
        self.rpc_dup = emit_deprecated_names() if rpc_dup is None else rpc_dup
        #: gRPC methods one end of a traced connection decoded, for the other end.
        self.peer_methods = PeerMethods()
        #: The pipeline's GenAI layer (otelbpf.semantics.genai.attach), or None: a stream
        #: that is an LLM call (a v2 inference gRPC call too) also gets the GenAI name and attributes.
        self.genai = None

    def span(self, start: SpanStart, exchange: Http2Exchange, conn, options: SpanOptions) -> SpanRecord:
        request, response = exchange.request, exchange.response
        server = start.kind == SpanKind.SERVER
        attrs: dict[str, AttributeValue] = {}
        attrs[NETWORK_PROTOCOL_NAME] = "http"
        attrs[NETWORK_PROTOCOL_VERSION] = "2"
        network_transport(conn, attrs)
        authority = request.header(":authority") or ""
        default_port = conn.local_port if server else conn.peer_port
        host, port = split_host(authority, default_port) if authority else (
            (conn.local_addr, conn.local_port) if server else (conn.peer_addr, conn.peer_port)
        )
        if host:
            attrs[SERVER_ADDRESS] = host
        if port:
            attrs[SERVER_PORT] = port
        if server and conn.peer_addr:
            attrs[CLIENT_ADDRESS] = conn.peer_addr
            attrs[CLIENT_PORT] = conn.peer_port
        peer_attributes(conn, attrs)
        if is_grpc(exchange):
            pair = pair_key(conn, start.kind)
            stream_key = (pair, exchange.stream_id) if pair is not None else None
            name, status = grpc_attributes(exchange, start.kind, attrs, self.rpc_dup, self.peer_methods, stream_key)
        else:
            name, status = Http2Semantics._http_attributes(exchange, server, authority, options, attrs)
        genai = self.genai
        if genai is not None:  # an LLM call, or a v2 inference call over gRPC
            name = genai.annotate(exchange, attrs) or name
        if exchange.hpack_incomplete:
            attrs[OTELBPF_HTTP2_HPACK_INCOMPLETE] = True
        if exchange.upgraded:
            attrs[OTELBPF_HTTP2_UPGRADED] = True
        if exchange.reset_code is not None:
            attrs[OTELBPF_HTTP2_RESET_CODE] = exchange.reset_code
        if request.body_truncated or (response is not None and response.body_truncated):
            attrs[OTELBPF_PAYLOAD_TRUNCATED] = True
        answered = response is not None and response.ended
        outcome_code, message = outcome_status(exchange, answered, attrs)
        if outcome_code is StatusCode.ERROR:
            status = outcome_code
        return span_record(start, exchange, name, attrs, status, message)

    @staticmethod
    def _http_attributes(exchange, server: bool, authority: str, options, attrs) -> tuple[str, StatusCode]:
        request, response = exchange.request, exchange.response
        raw_method = request.header(":method")
        method = raw_method if raw_method in HTTP_KNOWN_METHODS else HTTP_OTHER_METHOD
        attrs[HTTP_REQUEST_METHOD] = method
        if raw_method and method == HTTP_OTHER_METHOD:
            attrs[HTTP_REQUEST_METHOD_ORIGINAL] = raw_method
        path, query = split_target(request.header(":path") or "")
        scheme = request.header(":scheme") or "http"
        http_request_extras(request.header("user-agent"), request.body_size, attrs)
        status = StatusCode.UNSET
        code = response.header(":status") if response is not None else None
        if code is not None and code.isdigit():
            status = http_response_status(int(code), server, attrs)
        if response is not None and response.body_size:
            attrs[HTTP_RESPONSE_BODY_SIZE] = response.body_size
        label = method if method != HTTP_OTHER_METHOD else "HTTP"
        if server:
            attrs[URL_SCHEME] = scheme
            if request.header(":path") is not None:
                route = derive_route(path)
                attrs[URL_PATH] = path
                attrs[HTTP_ROUTE] = route
                if options.include_query and query:
                    attrs[URL_QUERY] = query
                if method != HTTP_OTHER_METHOD:
                    label = f"{method} {route}"
            return label, status
        if request.header(":path") is not None:
            full = f"{scheme}://{authority}{path}"
            if options.include_query and query:
                full += f"?{query}"
            attrs[URL_FULL] = full
        return label, status


SEMANTICS = Http2Semantics()
