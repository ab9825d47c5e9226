"""What every protocol's span semantics shares.

* :class:`SpanSemantics`, the interface a protocol module implements;
* :class:`SpanOptions`, what the user decided about privacy;
* :func:`network_transport`, :func:`peer_attributes`: from the connection;
* :func:`outcome_status`: how an exchange's outcome shows on the span;
* :func:`span_record`: the finished :class:`SpanRecord` from its identity.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable

from otelbpf.core.events import CallEvent, Source
from otelbpf.core.identity import SpanStart
from otelbpf.core.model import AttributeValue, SpanRecord, StatusCode
from otelbpf.semconv import (
    ERROR_TYPE,
    HTTP_REQUEST_BODY_SIZE,
    HTTP_RESPONSE_STATUS_CODE,
    NETWORK_PEER_ADDRESS,
    NETWORK_PEER_PORT,
    NETWORK_TRANSPORT,
    OTELBPF_ASSOCIATION,
    OTELBPF_EXCHANGE_END_REASON,
    THREAD_ID,
    USER_AGENT_ORIGINAL,
)
from protocols.base import Exchange, Outcome


@dataclass(slots=True)
class SpanOptions:
    """Privacy and detail choices (private by default: see README "What a span carries")."""

    #: Export ``url.query`` (query strings often carry tokens).
    include_query: bool = False
    #: Export LLM prompt and completion text (``gen_ai.input.messages`` /
    #: ``gen_ai.output.messages``, truncated); off by default (``--capture-genai-content``).
    capture_genai_content: bool = False


class SpanSemantics(Protocol):
    """Turns one protocol's exchanges into spans."""

    #: The protocol id (the package under ``protocols/``).
    protocol: str

    def span(self, start: SpanStart, exchange: Exchange, conn, options: SpanOptions) -> SpanRecord:
        """The finished span for ``exchange``, seen on connection ``conn``
        (``otelbpf.core.connections.Connection``), with the identity ``start``."""
        ...


@runtime_checkable
class CallSemantics(Protocol):
    """Turns library calls seen by uprobes (``CallEvent``) into spans.

    A library's call semantics subclasses this class: the optional capability below has
    its default here (``Registry.register_calls`` refuses semantics that do not subclass it).
    """

    #: The library family it handles (``CallEvent.library``).
    library: str
    #: Where a call made on a thread that serves no request goes: the identity of the
    #: span it joins (GPU engine steps: otelbpf/semantics/gpu_steps.py), or None for a
    #: root span. None here: such calls are roots.
    place_off_request: "Callable[[CallEvent], SpanStart | None] | None" = None

    def span(self, start: SpanStart, call: CallEvent) -> SpanRecord | None:
        """The span for ``call``, or None when the call is only counted."""
        ...


def scope_name(protocol: str) -> str:
    """The instrumentation scope of a protocol's spans: ``otelbpf.<id>``
    (remembered per protocol: asked once per span)."""
    scope = _SCOPES.get(protocol)
    if scope is None:
        scope = f"otelbpf.{protocol}"
        if len(_SCOPES) < 256:
            _SCOPES[protocol] = scope
    return scope


_SCOPES: dict[str, str] = {}


def url_scheme(conn) -> str:
    """``https`` when the bytes came from the TLS plaintext probes, else ``http``."""
    return "https" if getattr(conn, "source", _SOCKET) == _TLS else "http"


# Read once: a member read off its enum class (or a module) is an attribute look-up per span.
_SOCKET = int(Source.SOCKET)
_TLS = int(Source.TLS)
_AF_UNIX = socket.AF_UNIX
_UNSET = StatusCode.UNSET
_ERROR = StatusCode.ERROR
_COMPLETE = Outcome.COMPLETE


def network_transport(conn, attrs: dict[str, AttributeValue]) -> None:
    """``network.transport`` from the connection: ``unix``, ``udp`` or ``tcp``."""
    if conn.family == _AF_UNIX:
        attrs[NETWORK_TRANSPORT] = "unix"
    else:
        attrs[NETWORK_TRANSPORT] = "udp" if conn.datagram else "tcp"


def peer_attributes(conn, attrs: dict[str, AttributeValue]) -> None:
    """``network.peer.address``/``port`` from the connection's tuple, when known."""
    if conn.peer_addr:
        attrs[NETWORK_PEER_ADDRESS] = conn.peer_addr
        attrs[NETWORK_PEER_PORT] = conn.peer_port


def http_request_extras(user_agent: str | None, body_size: int, attrs: dict[str, AttributeValue]) -> None:
    """The request attributes HTTP/1 and HTTP/2 spans share: user agent, body size."""
    if user_agent:
        attrs[USER_AGENT_ORIGINAL] = user_agent
    if body_size:
        attrs[HTTP_REQUEST_BODY_SIZE] = body_size


def http_response_status(status: int, server: bool, attrs: dict[str, AttributeValue]) -> StatusCode:
    """Record an HTTP response status; return the span status the HTTP conventions give it:
    an error from 500 up on a server, from 400 up on a client (then ``error.type`` is the code)."""
    attrs[HTTP_RESPONSE_STATUS_CODE] = status
    if status >= 500 or (not server and status >= 400):
        attrs[ERROR_TYPE] = str(status)
        return _ERROR
    return _UNSET


def outcome_status(
    exchange: Exchange, answered: bool, attrs: dict[str, AttributeValue]
) -> tuple[StatusCode, str]:
    """How the exchange's outcome shows: nothing when COMPLETE; otherwise
    ``otelbpf.exchange.end_reason``, and an error when no complete answer
    was seen (``answered`` False), with ``error.type`` set to the outcome
    unless the protocol set one already."""
    outcome = exchange.outcome
    if outcome is _COMPLETE:
        return _UNSET, ""
    attrs[OTELBPF_EXCHANGE_END_REASON] = outcome.value
    if answered:
        return _UNSET, ""
    attrs.setdefault(ERROR_TYPE, outcome.value)
    return _ERROR, f"no complete response ({outcome.value})"


def span_record(
    start: SpanStart,
    exchange: Exchange,
    name: str,
    attrs: dict[str, AttributeValue],
    status: StatusCode,
    message: str,
) -> SpanRecord:
    """The finished span: identity from ``start``, times from the exchange,
    ``thread.id`` and ``otelbpf.association`` added here for every protocol."""
    attrs[THREAD_ID] = start.tid
    if start.association:
        attrs[OTELBPF_ASSOCIATION] = start.association
    start_ns = exchange.start_ns
    end_ns = exchange.end_ns
    protocol = exchange.protocol
    # positional: a compiled SpanRecord matches keywords one by one (SpanRecord.__init__'s order)
    return SpanRecord(
        start.trace_id,
        start.span_id,
        name,
        start.kind,
        start_ns,
        end_ns if end_ns > start_ns else start_ns,
        start.pid,
        start.parent_span_id,
        attrs,
        status,
        message,
        start.trace_state,
        None,  # links
        scope_name(protocol),
        protocol,
    )
