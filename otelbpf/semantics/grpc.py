"""gRPC calls on HTTP/2 streams -> spans by the RPC conventions v1.44
(docs/rpc/rpc-spans.md, docs/rpc/grpc.md in semantic-conventions).

* ``rpc.system.name`` = ``grpc``; ``rpc.method`` = ``pkg.Service/Method``
  (the ``:path`` without its leading slash), also the span name; when the
  method is unknown (HPACK could not decode ``:path`` on a connection older
  than the agent) ``rpc.method`` is ``_OTHER`` and the span is named
  ``grpc``. ``otelbpf.rpc.method.source`` says which (``header`` or
  ``unknown``).
* ``rpc.response.status_code``: the status name from ``grpc-status`` in the
  trailers, or in the headers of a Trailers-Only response.
* Error status: on the client every code but OK; on the server only
  UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS
  (``error.type`` = the status name). A call with no status at all (reset,
  connection closed) is an error with the outcome as ``error.type``.
* ``OTEL_SEMCONV_STABILITY_OPT_IN=rpc/dup`` also writes the deprecated
  ``rpc.system``, ``rpc.service`` and ``rpc.grpc.status_code``.
"""

from __future__ import annotations

import os

from otelbpf import semconv as sc
from otelbpf.model import AttributeValue, SpanKind, StatusCode
from protocols.http2.types import Http2Exchange

GRPC_CONTENT_TYPE = "application/grpc"


def emit_deprecated_names(environ=os.environ) -> bool:
    """Whether ``OTEL_SEMCONV_STABILITY_OPT_IN`` lists ``rpc/dup``."""
    values = environ.get(sc.SEMCONV_OPT_IN_ENV, "")
    return sc.SEMCONV_OPT_IN_RPC_DUP in {value.strip() for value in values.split(",")}


def is_grpc(exchange: Http2Exchange) -> bool:
    """A gRPC call: its content-type says so, or (headers not decoded on a late
    connection) the response carries ``grpc-status``."""
    content_type = exchange.request.header("content-type")
    if content_type is None and exchange.response is not None:
        content_type = exchange.response.header("content-type")
    if content_type is not None:
        return content_type.startswith(GRPC_CONTENT_TYPE)
    return exchange.response is not None and exchange.response.header("grpc-status") is not None


def status_name(code: str | None) -> str | None:
    """``grpc-status`` (a number) as its name; an unknown number stays a number."""
    if code is None or not code.strip().isdigit():
        return None
    number = int(code)
    return sc.GRPC_STATUS_NAMES[number] if number < len(sc.GRPC_STATUS_NAMES) else str(number)


def grpc_attributes(
    exchange: Http2Exchange, kind: SpanKind, attrs: dict[str, AttributeValue], dup: bool
) -> tuple[str, StatusCode]:
    """Add the RPC attributes; return the span name and status."""
    path = exchange.request.header(":path")
    attrs[sc.RPC_SYSTEM_NAME] = sc.RPC_SYSTEM_GRPC
    if path:
        method = path[1:] if path.startswith("/") else path
        attrs[sc.RPC_METHOD] = method
        attrs[sc.OTELBPF_RPC_METHOD_SOURCE] = "header"
        name = method
    else:
        method = ""
        attrs[sc.RPC_METHOD] = sc.RPC_OTHER_METHOD
        attrs[sc.OTELBPF_RPC_METHOD_SOURCE] = "unknown"
        name = sc.RPC_SYSTEM_GRPC
    response = exchange.response
    code = response.header("grpc-status") if response is not None else None
    status = status_name(code)
    result = StatusCode.UNSET
    if status is not None:
        attrs[sc.RPC_RESPONSE_STATUS_CODE] = status
        is_error = status != "OK" if kind == SpanKind.CLIENT else status in sc.GRPC_SERVER_ERROR_STATUSES
        if is_error:
            attrs[sc.ERROR_TYPE] = status
            result = StatusCode.ERROR
    if exchange.request.grpc_messages is not None:
        attrs[sc.OTELBPF_RPC_REQUEST_MESSAGES] = exchange.request.grpc_messages
    if response is not None and response.grpc_messages is not None:
        attrs[sc.OTELBPF_RPC_RESPONSE_MESSAGES] = response.grpc_messages
    if dup:
        attrs[sc.RPC_SYSTEM_OLD] = sc.RPC_SYSTEM_GRPC
        if "/" in method:
            attrs[sc.RPC_SERVICE_OLD] = method.rsplit("/", 1)[0]
        if code is not None and code.strip().isdigit():
            attrs[sc.RPC_GRPC_STATUS_CODE_OLD] = int(code)
    return name, result
