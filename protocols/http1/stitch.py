"""Pairs HTTP/1.x requests with responses into exchanges, per connection.

HTTP/1.x answers requests strictly in order (pipelining included), so
pairing is FIFO: each final response answers the oldest request still
waiting for one. The request parser tells us when an exchange starts (its
head is parsed), the response parser when it ends (its final response is
over).
"""

from __future__ import annotations

from collections import deque

from protocols.base import (
    Direction,
    ExchangeCompleted,
    ExchangeKind,
    ExchangeProgress,
    ExchangeStarted,
    Outcome,
    Phase,
    ProgressFilter,
    SessionEvent,
    abandon,
)
from protocols.http1.parse import BodyData, BodyTap, HeadComplete, HttpParser, ParserEvent
from protocols.http1.types import PROTOCOL, HttpExchange, HttpRequest, HttpResponse


class Http1Session:
    """One HTTP/1.x connection as seen by one traced process (``Session`` of base.py).

    Bytes moving in ``request_direction`` are requests, the other way
    responses. At most ``max_pending`` requests wait for a response; one
    more ends the oldest with outcome EVICTED. After 101 Switching
    Protocols or a CONNECT tunnel the connection no longer carries HTTP/1:
    its bytes are ignored (they are not errors).

    Progress: with ``progress`` on, the response's first byte
    (``Phase.RESPONSE_START``) and every piece of request and response body
    (``REQUEST_BODY``, ``RESPONSE_BODY``, with their data and time) are
    reported as ``ExchangeProgress`` (off, they cost nothing: the detector
    turns them on when a consumer observes them); ``progress_filter``, asked
    once per exchange at its request head, narrows them to the exchanges it
    accepts; it may accept one with a :class:`~protocols.http1.parse.BodyTap` instead of
    True, a reader the response parser hands that response's body to from its first
    byte (an LLM call's SSE stream: no progress event per body piece). At most
    ``body_limit`` bytes of each body are also kept on the messages.
    """

    protocol = PROTOCOL

    def __init__(
        self,
        request_direction: Direction,
        body_limit: int = 65536,
        max_pending: int = 256,
        progress: bool = True,
        progress_filter: ProgressFilter | None = None,
    ) -> None:
        self.request_direction = request_direction
        self.progress = progress
        self.progress_filter = progress_filter
        self.kind = ExchangeKind.for_request(request_direction)
        self.max_pending = max_pending
        # Body pieces are only read for progress reports: without them the
        # parsers make no BodyData (message.body still keeps body_limit bytes).
        self._requests = HttpParser("request", body_limit, body_events=progress)
        # The response parser forgets the oldest expected method exactly when
        # _start_exchange evicts the oldest pending exchange: same bound.
        self._responses = HttpParser("response", body_limit, max_pending=max_pending, body_events=progress)
        self._pending: deque[HttpExchange] = deque()  # waiting for a final response head
        self._answering: HttpExchange | None = None  # final response head seen, body in progress
        self._requesting: HttpExchange | None = None  # its request's body is being read
        self._stitch_errors = 0
        self._tunnelled = False

    @property
    def parse_errors(self) -> int:
        """Malformed bytes skipped by either parser, plus responses with no request."""
        return self._requests.parse_errors + self._responses.parse_errors + self._stitch_errors

    def at_rest(self) -> bool:
        """No exchange open and both parsers between messages (``HttpParser.at_rest``):
        what a fresh session would be, but for the counts of what was skipped."""
        return (
            not self._pending
            and self._answering is None
            and not self._tunnelled
            and self._requests.at_rest()
            and self._responses.at_rest()
        )

    def adopt_pending(self, exchange: HttpExchange) -> None:
        """Continue a connection whose ``exchange`` was started elsewhere (its request
        fully read, no response byte seen yet), as if this session had started it:
        the next final response answers it. For a session taking over from the
        compiled fast path (otelbpf/fastpath) at a message boundary."""
        self._pending.append(exchange)
        self._requesting = exchange
        self._responses.expect_response_to(exchange.request.method)

    def adopt_answering(self, exchange: HttpExchange, remaining: int, parts: list[bytes], last_byte_ns: int) -> None:
        """Continue a connection whose ``exchange`` was started and answered elsewhere:
        its final response's head and the first bytes of its ``Content-Length`` body
        were read, ``remaining`` bytes are still to come (``HttpParser.adopt_fixed_body``).
        For a session taking over from the compiled fast path in the middle of a body."""
        self._answering = exchange
        self._requesting = exchange
        response = exchange.response
        self._responses.adopt_fixed_body(response, remaining, parts, response.start_ns, last_byte_ns)

    def feed(self, direction: Direction, data: bytes, ts_ns: int, missing: int = 0) -> list[SessionEvent]:
        out: list[SessionEvent] = []
        if self._tunnelled:
            return out
        if direction == self.request_direction:
            self._on_request_events(self._requests.feed(data, ts_ns, missing), ts_ns, out)
        else:
            if self.progress:
                self._responses.body_events = self._response_pieces_wanted()
            self._on_response_events(self._responses.feed(data, ts_ns, missing), out)
            self._tunnelled = self._responses.opaque
        return out

    def _response_pieces_wanted(self) -> bool:
        """Whether an exchange these response bytes may answer reports progress
        (its body pieces): if none does, the parser makes no BodyData for them."""
        answering = self._answering
        if answering is not None and answering.reports_progress:
            return True
        for exchange in self._pending:
            if exchange.reports_progress:
                return True
        return False

    def close(self, ts_ns: int) -> list[SessionEvent]:
        """End every open exchange; a response delimited by the close completes normally."""
        out: list[SessionEvent] = []
        if not self._tunnelled:
            self._requests.close()  # marks a request cut mid-body complete=False
            self._on_response_events(self._responses.close(), out, closed_ns=ts_ns)
        while self._pending:
            out.append(abandon(self._pending.popleft(), Outcome.CONNECTION_CLOSED, ts_ns))
        return out

    def _on_request_events(self, events: list[ParserEvent], ts_ns: int, out: list[SessionEvent]) -> None:
        for event in events:
            kind = type(event)
            if kind is HeadComplete:
                assert isinstance(event.message, HttpRequest)
                self._start_exchange(event.message, ts_ns, out)
            elif kind is BodyData:
                exchange = self._requesting
                if exchange is not None and exchange.reports_progress and exchange.request is event.message:
                    out.append(ExchangeProgress(exchange, Phase.REQUEST_BODY, event.ts_ns, event.data))
            # MessageComplete: the request object the exchange holds is now final.

    def _start_exchange(self, request: HttpRequest, ts_ns: int, out: list[SessionEvent]) -> None:
        exchange = HttpExchange(request=request, kind=self.kind)
        tap = None
        if self.progress:
            wanted = self.progress_filter
            reports = wanted is None or wanted(exchange)
            if isinstance(reports, BodyTap):  # the filter's reader for the response's body
                tap, reports = reports, True
            exchange.reports_progress = reports
        self._pending.append(exchange)
        self._requesting = exchange
        self._responses.expect_response_to(request.method, tap)
        out.append(ExchangeStarted(exchange))
        if len(self._pending) > self.max_pending:
            out.append(abandon(self._pending.popleft(), Outcome.EVICTED, ts_ns))

    def _on_response_events(
        self, events: list[ParserEvent], out: list[SessionEvent], closed_ns: int | None = None
    ) -> None:
        """Pair response heads with the oldest pending request; end exchanges as responses end.

        A response that ends incomplete while the connection is open lost
        capture (a gap, splice) but did end its exchange: COMPLETE. Only at
        close (``closed_ns`` given) was it cut short: CONNECTION_CLOSED.
        """
        for event in events:
            kind = type(event)
            if kind is BodyData:
                answering = self._answering
                if answering is not None and answering.reports_progress:
                    out.append(ExchangeProgress(answering, Phase.RESPONSE_BODY, event.ts_ns, event.data))
                continue
            response = event.message
            assert isinstance(response, HttpResponse)
            if kind is HeadComplete:
                self._answer_oldest(response)
                answering = self._answering
                if answering is not None and answering.reports_progress:
                    out.append(ExchangeProgress(answering, Phase.RESPONSE_START, response.start_ns))
            elif self._answering is not None:
                if closed_ns is not None and not response.complete:
                    out.append(abandon(self._answering, Outcome.CONNECTION_CLOSED, closed_ns))
                else:
                    out.append(ExchangeCompleted(self._answering))
                self._answering = None

    def _answer_oldest(self, response: HttpResponse) -> None:
        if not self._pending:
            self._stitch_errors += 1  # capture began mid-exchange, or a request was lost
            return
        self._answering = self._pending.popleft()
        self._answering.response = response

