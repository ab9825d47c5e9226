"""Where an exchange becomes a span: names and attributes by the OpenTelemetry
HTTP semantic conventions.

The span's identity (trace ID, span ID, parent) is fixed when the request
starts (otelbpf.identity.SpanStart), before the exchange completes, so that
work done while serving it can point at it. :func:`http_span` fills in the
rest when the exchange completes.

Private by default: query strings are not exported and no header values but
``User-Agent`` and ``Host`` are read, unless the user opts in.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass

from otelbpf.identity import SpanStart
from otelbpf.model import AttributeValue, SpanKind, SpanRecord, StatusCode
from protocols.http1.types import HttpExchange

KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "QUERY"})

_UUID = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")
_HEX_ID = re.compile(r"^(?=.*\d)[0-9a-fA-F]{12,}$")
_TOKEN_ID = re.compile(r"^(?=.*\d)(?=.*[A-Za-z])[A-Za-z0-9_-]{24,}$")


@dataclass(slots=True)
class PrivacyOptions:
    include_query: bool = False


def _is_identifier(segment: str) -> bool:
    return segment.isdigit() or bool(_UUID.match(segment) or _HEX_ID.match(segment) or _TOKEN_ID.match(segment))


def derive_route(path: str) -> str:
    """A low-cardinality route from a concrete path: IDs become ``{id}``.

    ``/v1/users/12345/orders/9f86d081884c7d65`` -> ``/v1/users/{id}/orders/{id}``
    """
    if not path.startswith("/"):
        return path
    parts = path.split("/")
    return "/".join("{id}" if part and _is_identifier(part) else part for part in parts)


def split_target(target: str) -> tuple[str, str]:
    """(path, query) of a request-target in origin or absolute form."""
    if target.startswith(("http://", "https://")):
        rest = target.split("://", 1)[1]
        slash = rest.find("/")
        target = rest[slash:] if slash >= 0 else "/"
    path, _, query = target.partition("?")
    path = path.partition("#")[0]
    return path or "/", query


def split_host(host: str, default_port: int) -> tuple[str, int]:
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


def http_span(start: SpanStart, exchange: HttpExchange, conn, privacy: PrivacyOptions) -> SpanRecord:
    """Build the finished span for ``exchange`` seen on connection ``conn``."""
    request = exchange.request
    response = exchange.response
    server = start.kind == SpanKind.SERVER
    method = request.method if request.method in KNOWN_METHODS else "_OTHER"
    path, query = split_target(request.target)

    attrs: dict[str, AttributeValue] = {"http.request.method": method}
    if method == "_OTHER":
        attrs["http.request.method_original"] = request.method
    attrs["network.protocol.name"] = "http"
    attrs["network.transport"] = "unix" if conn.family == socket.AF_UNIX else "tcp"
    attrs["network.protocol.version"] = request.version
    host_header = request.header("host") or ""
    if server:
        route = derive_route(path)
        name = f"{method} {route}" if method != "_OTHER" else "HTTP"
        attrs["url.path"] = path
        attrs["url.scheme"] = "http"
        attrs["http.route"] = route
        if privacy.include_query and query:
            attrs["url.query"] = query
        host, port = split_host(host_header, conn.local_port) if host_header else (conn.local_addr, conn.local_port)
        if host:
            attrs["server.address"] = host
        if port:
            attrs["server.port"] = port
        if conn.peer_addr:
            attrs["client.address"] = conn.peer_addr
    else:
        name = method if method != "_OTHER" else "HTTP"
        host, port = split_host(host_header, conn.peer_port) if host_header else (conn.peer_addr, conn.peer_port)
        if host:
            attrs["server.address"] = host
        if port:
            attrs["server.port"] = port
        authority = host_header or (f"{conn.peer_addr}:{conn.peer_port}" if conn.peer_addr else "")
        full = f"http://{authority}{path}"
        if privacy.include_query and query:
            full += f"?{query}"
        attrs["url.full"] = full
    if conn.peer_addr:
        attrs["network.peer.address"] = conn.peer_addr
        attrs["network.peer.port"] = conn.peer_port
    user_agent = request.header("user-agent")
    if user_agent:
        attrs["user_agent.original"] = user_agent
    if request.body_size:
        attrs["http.request.body.size"] = request.body_size
    attrs["thread.id"] = start.tid
    if start.association:
        attrs["otelbpf.association"] = start.association

    status = StatusCode.UNSET
    message = ""
    if response is not None:
        attrs["http.response.status_code"] = response.status
        if response.body_size:
            attrs["http.response.body.size"] = response.body_size
        failed = response.status >= 500 or (not server and response.status >= 400)
        if failed:
            status = StatusCode.ERROR
            attrs["error.type"] = str(response.status)
        if not response.complete:
            attrs["otelbpf.response.incomplete"] = True
        if response.body_truncated or request.body_truncated:
            attrs["otelbpf.payload.truncated"] = True
        if conn.sendfile_ns and conn.sendfile_ns >= request.start_ns:
            attrs["otelbpf.response.body.sendfile"] = True
    if exchange.end_reason != "complete":
        attrs["otelbpf.exchange.end_reason"] = exchange.end_reason
        if response is None or not response.complete:
            status = StatusCode.ERROR
            attrs.setdefault("error.type", exchange.end_reason)
            message = f"no complete response ({exchange.end_reason})"

    return SpanRecord(
        trace_id=start.trace_id,
        span_id=start.span_id,
        parent_span_id=start.parent_span_id,
        name=name,
        kind=start.kind,
        start_ns=exchange.start_ns,
        end_ns=max(exchange.end_ns, exchange.start_ns),
        pid=start.pid,
        attributes=attrs,
        status_code=status,
        status_message=message,
        trace_state=start.trace_state,
        scope="otelbpf.http",
    )
