"""Where an HTTP/1.x exchange becomes a span: names and attributes by the
OpenTelemetry HTTP semantic conventions.

SERVER spans are named ``{method} {http.route}``, CLIENT spans ``{method}``;
methods the conventions do not know become ``_OTHER`` (span name ``HTTP``).
The route is the path with identifiers collapsed (:func:`derive_route`).

Private by default: query strings are not exported and no header values but
``User-Agent`` and ``Host`` are read, unless the user opts in.

An exchange that is an LLM API call (OpenAI-compatible, Ollama) is also a
GenAI span: its name and ``gen_ai.*`` attributes come from the pipeline's
GenAI layer (``otelbpf/semantics/genai.py``), when one is attached.
"""

from __future__ import annotations

import re

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
    url_scheme,
)
from otelbpf.semconv import (
    CLIENT_ADDRESS,
    HTTP_KNOWN_METHODS,
    HTTP_OTHER_METHOD,
    HTTP_REQUEST_METHOD,
    HTTP_REQUEST_METHOD_ORIGINAL,
    HTTP_RESPONSE_BODY_SIZE,
    HTTP_ROUTE,
    NETWORK_PROTOCOL_NAME,
    NETWORK_PROTOCOL_VERSION,
    OTELBPF_PAYLOAD_TRUNCATED,
    OTELBPF_RESPONSE_BODY_SENDFILE,
    OTELBPF_RESPONSE_INCOMPLETE,
    SERVER_ADDRESS,
    SERVER_PORT,
    URL_FULL,
    URL_PATH,
    URL_QUERY,
    URL_SCHEME,
)
from protocols.http1.types import PROTOCOL, FieldBlock, HttpExchange

_UUID = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")
_HEX_ID = re.compile(r"^(?=.*\d)[0-9a-fA-F]{12,}$")
_TOKEN_ID = re.compile(r"^(?=.*\d)(?=.*[A-Za-z])[A-Za-z0-9_-]{24,}$")


# Read once: a member read off its enum class is an attribute look-up per span.
_SERVER = SpanKind.SERVER
_UNSET = StatusCode.UNSET
_ERROR = StatusCode.ERROR


def _is_identifier(segment: str) -> bool:
    return segment.isdigit() or bool(_UUID.match(segment) or _HEX_ID.match(segment) or _TOKEN_ID.match(segment))


def derive_route(path: str) -> str:
    """A low-cardinality route from a concrete path: IDs become ``{id}``.

    ``/v1/users/12345/orders/9f86d081884c7d65`` -> ``/v1/users/{id}/orders/{id}``

    Remembered per path (a server sees the same few paths over and over;
    deriving one costs a regex per segment): at most ``_ROUTE_CACHE_SIZE``
    paths, forgotten all at once when full, and none longer than
    ``_ROUTE_CACHE_MAX_LEN``.
    """
    route = _ROUTES.get(path)
    if route is None:
        route = _remember(_ROUTES, path, len(path), _derive_route(path))
    return route


_ROUTES: dict[str, str] = {}
_ROUTE_CACHE_SIZE = 4096
_ROUTE_CACHE_MAX_LEN = 256


def _remember(table: dict, key, size: int, value):
    """``value``, kept for ``key`` in ``table`` (one of this module's memos of
    what repeats per request): at most ``_ROUTE_CACHE_SIZE`` entries, forgotten
    all at once when full, none for text longer than ``_ROUTE_CACHE_MAX_LEN``."""
    if size <= _ROUTE_CACHE_MAX_LEN:
        if len(table) >= _ROUTE_CACHE_SIZE:
            table.clear()
        table[key] = value
    return value


def _derive_route(path: str) -> str:
    if not path.startswith("/"):
        return path
    parts = path.split("/")
    return "/".join("{id}" if part and _is_identifier(part) else part for part in parts)


def split_target(target: str) -> tuple[str, str]:
    """(path, query) of a request-target in origin or absolute form (remembered
    per target, like routes)."""
    split = _TARGETS.get(target)
    if split is None:
        split = _remember(_TARGETS, target, len(target), _split_target(target))
    return split


_TARGETS: dict[str, tuple[str, str]] = {}


def _split_target(target: str) -> tuple[str, str]:
    if target.startswith(("http://", "https://")):
        rest = target.split("://", 1)[1]
        slash = rest.find("/")
        target = rest[slash:] if slash >= 0 else "/"
    path, _, query = target.partition("?")
    path = path.partition("#")[0]
    return path or "/", query


def _host_and_user_agent(headers: FieldBlock | list[tuple[str, str]]) -> tuple[str, str | None]:
    """The first ``host`` (or "") and ``user-agent`` values, in one pass over the
    headers (what ``request.header`` gives for each, for half the walking)."""
    if type(headers) is FieldBlock:  # two searches of the head's text, no pairs built
        block: FieldBlock = headers
        return block.get("host") or "", block.get("user-agent")
    host = user_agent = None
    for name, value in headers:
        if name == "host":
            if host is None:
                host = value
        elif name == "user-agent":
            if user_agent is None:
                user_agent = value
    return host or "", user_agent


def split_host(host: str, default_port: int) -> tuple[str, int]:
    """(address, port) of a Host header or authority; ``default_port`` when it names none.

    Remembered per (host, default port), like routes: a server is asked for
    the same one or two hosts on every request."""
    key = (host, default_port)
    split = _HOSTS.get(key)
    if split is None:
        split = _remember(_HOSTS, key, len(host), _split_host(host, default_port))
    return split


_HOSTS: dict[tuple[str, int], tuple[str, int]] = {}


def _split_host(host: str, default_port: int) -> tuple[str, int]:
    if host.startswith("["):  # [v6]:port
        end = host.find("]")
        addr = host[1:end]
        port_text = host[end + 2 :] if host[end + 1 : end + 2] == ":" else ""
    else:
        addr, _, port_text = host.partition(":")
    try:
        port = int(port_text) if port_text else default_port
    except ValueError:
        port = default_port
    return addr, port


class Http1Semantics:
    """``SpanSemantics`` for HTTP/1.x (protocols/http1)."""

    protocol = PROTOCOL

    def __init__(self) -> None:
        #: The pipeline's GenAI layer (otelbpf.semantics.genai.attach), or None:
        #: an exchange that is an LLM call also gets the GenAI name and attributes.
        self.genai = None

    def span(self, start: SpanStart, exchange: HttpExchange, conn, options: SpanOptions) -> SpanRecord:
        request = exchange.request
        response = exchange.response
        server = start.kind == _SERVER
        method = request.method if request.method in HTTP_KNOWN_METHODS else HTTP_OTHER_METHOD
        path, query = split_target(request.target)

        attrs: dict[str, AttributeValue] = {HTTP_REQUEST_METHOD: method}
        if method == HTTP_OTHER_METHOD:
            attrs[HTTP_REQUEST_METHOD_ORIGINAL] = request.method
        attrs[NETWORK_PROTOCOL_NAME] = "http"
        network_transport(conn, attrs)
        attrs[NETWORK_PROTOCOL_VERSION] = request.version
        host_header, user_agent = _host_and_user_agent(request.headers)
        if server:
            name = Http1Semantics._server_attributes(method, path, query, host_header, conn, options, attrs)
        else:
            name = Http1Semantics._client_attributes(method, path, query, host_header, conn, options, attrs)
        peer_attributes(conn, attrs)
        http_request_extras(user_agent, request.body_size, attrs)

        status = _UNSET
        if response is not None:
            status = http_response_status(response.status, server, attrs)
            if response.body_size:
                attrs[HTTP_RESPONSE_BODY_SIZE] = response.body_size
            if not response.complete:
                attrs[OTELBPF_RESPONSE_INCOMPLETE] = True
            if response.body_truncated or request.body_truncated:
                attrs[OTELBPF_PAYLOAD_TRUNCATED] = True
            if conn.sendfile_ns and conn.sendfile_ns >= request.start_ns:
                attrs[OTELBPF_RESPONSE_BODY_SENDFILE] = True
        answered = response is not None and response.complete
        outcome_code, message = outcome_status(exchange, answered, attrs)
        if outcome_code is _ERROR:
            status = outcome_code
        genai = self.genai
        if genai is not None:
            genai_name = genai.annotate(exchange, attrs)
            if genai_name is not None:
                name = genai_name
        return span_record(start, exchange, name, attrs, status, message)

    @staticmethod
    def _server_attributes(method, path, query, host_header, conn, options, attrs) -> str:
        route = derive_route(path)
        attrs[URL_PATH] = path
        attrs[URL_SCHEME] = url_scheme(conn)
        attrs[HTTP_ROUTE] = route
        if options.include_query and query:
            attrs[URL_QUERY] = query
        host, port = split_host(host_header, conn.local_port) if host_header else (conn.local_addr, conn.local_port)
        if host:
            attrs[SERVER_ADDRESS] = host
        if port:
            attrs[SERVER_PORT] = port
        if conn.peer_addr:
            attrs[CLIENT_ADDRESS] = conn.peer_addr
        return f"{method} {route}" if method != HTTP_OTHER_METHOD else "HTTP"

    @staticmethod
    def _client_attributes(method, path, query, host_header, conn, options, attrs) -> str:
        host, port = split_host(host_header, conn.peer_port) if host_header else (conn.peer_addr, conn.peer_port)
        if host:
            attrs[SERVER_ADDRESS] = host
        if port:
            attrs[SERVER_PORT] = port
        authority = host_header or (f"{conn.peer_addr}:{conn.peer_port}" if conn.peer_addr else "")
        full = f"{url_scheme(conn)}://{authority}{path}"
        if options.include_query and query:
            full += f"?{query}"
        attrs[URL_FULL] = full
        return method if method != HTTP_OTHER_METHOD else "HTTP"


SEMANTICS = Http1Semantics()
