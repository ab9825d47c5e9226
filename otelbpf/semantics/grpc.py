"""gRPC calls on HTTP/2 streams -> spans by the RPC conventions v1.44
(docs/rpc/rpc-spans.md, docs/rpc/grpc.md in semantic-conventions).

* ``rpc.system.name`` = ``grpc``; ``rpc.method`` = ``pkg.Service/Method``
  (the ``:path`` without its leading slash), also the span name; when the
  method is unknown (HPACK could not decode ``:path`` on a connection older
  than the agent, or lost with uncaptured bytes), the method the *other end*
  of the same connection decoded for the same stream is used when the agent
  traces both processes (:class:`PeerMethods`); failing that ``rpc.method``
  is ``_OTHER`` and the span is named ``grpc``. ``otelbpf.rpc.method.source``
  says which: ``header``, ``peer`` or ``unknown``.
* ``rpc.response.status_code``: the status name from ``grpc-status`` in the
  trailers, or in the headers of a Trailers-Only response.
* Error status: on the client every code but OK; on the server only
  UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS
  (``error.type`` = the status name). A call with no status at all (reset,
  connection closed) is an error with the outcome as ``error.type``.
* A call of the v2 inference protocol (Triton, KServe: ``inference.GRPCInferenceService/
  ModelInfer``, ``ModelStreamInfer``) also gets the GenAI name and attributes, read from its
  messages (protocols/genai/v2grpc.py), when ``semantics/http2.py`` asks the GenAI layer
  after these attributes are written.
* ``OTEL_SEMCONV_STABILITY_OPT_IN=rpc/dup`` also writes the deprecated
  ``rpc.system``, ``rpc.service`` and ``rpc.grpc.status_code``.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Hashable

from otelbpf.core.model import AttributeValue, SpanKind, StatusCode
from otelbpf.semconv import (
    ERROR_TYPE,
    GRPC_SERVER_ERROR_STATUSES,
    GRPC_STATUS_NAMES,
    OTELBPF_RPC_METHOD_SOURCE,
    OTELBPF_RPC_REQUEST_MESSAGES,
    OTELBPF_RPC_RESPONSE_MESSAGES,
    RPC_GRPC_STATUS_CODE_OLD,
    RPC_METHOD,
    RPC_OTHER_METHOD,
    RPC_RESPONSE_STATUS_CODE,
    RPC_SERVICE_OLD,
    RPC_SYSTEM_GRPC,
    RPC_SYSTEM_NAME,
    RPC_SYSTEM_OLD,
    SEMCONV_OPT_IN_ENV,
    SEMCONV_OPT_IN_RPC_DUP,
)
from protocols.http2.types import Http2Exchange

GRPC_CONTENT_TYPE = "application/grpc"


def emit_deprecated_names(environ=os.environ) -> bool:
    """Whether ``OTEL_SEMCONV_STABILITY_OPT_IN`` lists ``rpc/dup``."""
    values = environ.get(SEMCONV_OPT_IN_ENV, "")
    return SEMCONV_OPT_IN_RPC_DUP in {value.strip() for value in values.split(",")}


def is_grpc(exchange: Http2Exchange) -> bool:
    """A gRPC call: its content-type says so. When HPACK left the content-type
    unknown (a connection older than the agent), a ``grpc-status``, or DATA
    that is whole gRPC length-prefixed messages in both directions, says so."""
    request, response = exchange.request, exchange.response
    content_type = request.header("content-type")
    if content_type is None and response is not None:
        content_type = response.header("content-type")
    if content_type is not None:
        return content_type.startswith(GRPC_CONTENT_TYPE)
    if response is None:
        return False
    if response.header("grpc-status") is not None:
        return True
    framed = request.grpc_framed and (response.grpc_framed or not response.body_size)
    return framed and bool(request.unknown_fields or response.unknown_fields)


def status_name(code: str | None) -> str | None:
    """``grpc-status`` (a number) as its name; an unknown number stays a number."""
    if code is None or not code.strip().isdigit():
        return None
    number = int(code)
    return GRPC_STATUS_NAMES[number] if number < len(GRPC_STATUS_NAMES) else str(number)


class PeerMethods:
    """Methods by (connection pair key, stream id), as whichever end decoded them.

    Both ends of a traced connection see the same bytes, but not always all of
    them: a client's write gathered from more iovecs than the probe copies
    loses its HEADERS, while the server's read of them is whole. The server's
    span ends (trailers written) before the client's (trailers read), so the
    client can take the method its peer decoded. Bounded (LRU).
    """

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self._methods: OrderedDict[Hashable, str] = OrderedDict()

    def remember(self, key: Hashable, method: str) -> None:
        # a key is a stream of a connection, never reused: inserting it puts it last, no move needed
        methods = self._methods
        methods[key] = method
        if len(methods) > self.capacity:
            methods.popitem(last=False)

    def recall(self, key: Hashable) -> str | None:
        return self._methods.pop(key, None)


def grpc_attributes(
    exchange: Http2Exchange,
    kind: SpanKind,
    attrs: dict[str, AttributeValue],
    dup: bool,
    peer_methods: PeerMethods | None = None,
    stream_key: Hashable | None = None,
) -> tuple[str, StatusCode]:
    """Add the RPC attributes; return the span name and status. ``stream_key``
    (the same from both ends of the stream) shares methods through ``peer_methods``."""
    path = exchange.request.header(":path")
    attrs[RPC_SYSTEM_NAME] = RPC_SYSTEM_GRPC
    source = "header"
    if path and peer_methods is not None and stream_key is not None:
        peer_methods.remember(stream_key, path)
    elif not path and peer_methods is not None and stream_key is not None:
        path = peer_methods.recall(stream_key)
        source = "peer"
    if path:
        method = path[1:] if path.startswith("/") else path
        attrs[RPC_METHOD] = method
        attrs[OTELBPF_RPC_METHOD_SOURCE] = source
        name = method
    else:
        method = ""
        attrs[RPC_METHOD] = RPC_OTHER_METHOD
        attrs[OTELBPF_RPC_METHOD_SOURCE] = "unknown"
        name = RPC_SYSTEM_GRPC
    response = exchange.response
    code = response.header("grpc-status") if response is not None else None
    status = status_name(code)
    result = StatusCode.UNSET
    if status is not None:
        attrs[RPC_RESPONSE_STATUS_CODE] = status
        is_error = status != "OK" if kind == SpanKind.CLIENT else status in GRPC_SERVER_ERROR_STATUSES
        if is_error:
            attrs[ERROR_TYPE] = status
            result = StatusCode.ERROR
    if exchange.request.grpc_messages is not None:
        attrs[OTELBPF_RPC_REQUEST_MESSAGES] = exchange.request.grpc_messages
    if response is not None and response.grpc_messages is not None:
        attrs[OTELBPF_RPC_RESPONSE_MESSAGES] = response.grpc_messages
    if dup:
        attrs[RPC_SYSTEM_OLD] = RPC_SYSTEM_GRPC
        if "/" in method:
            attrs[RPC_SERVICE_OLD] = method.rsplit("/", 1)[0]
        if code is not None and code.strip().isdigit():
            attrs[RPC_GRPC_STATUS_CODE_OLD] = int(code)
    return name, result
