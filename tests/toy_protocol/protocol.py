"""Detector, parser and session of the toy line protocol (sans-IO, like protocols/http1)."""

from __future__ import annotations

from dataclasses import dataclass, field

from protocols.base import (
    Detector,
    Direction,
    ExchangeCompleted,
    ExchangeKind,
    ExchangeProgress,
    ExchangeStarted,
    Outcome,
    Phase,
    SessionEvent,
    Transport,
    abandon,
)

PROTOCOL = "toy"
MAX_LINE = 256
MAX_PENDING = 64


@dataclass(slots=True)
class ToyExchange:
    request_id: str
    verb: str
    start_ns: int
    kind: ExchangeKind
    status: str = ""
    reply_ns: int = 0
    outcome: Outcome = Outcome.COMPLETE
    abandoned_ns: int = 0
    protocol: str = PROTOCOL
    headers: list[tuple[str, str]] = field(default_factory=list)

    @property
    def correlation_key(self) -> str:
        return self.request_id

    @property
    def message_key(self) -> None:
        return None

    @property
    def end_ns(self) -> int:
        return max(self.start_ns, self.reply_ns, self.abandoned_ns)

    def carrier(self) -> list[tuple[str, str]]:
        return self.headers


class ToySession:
    protocol = PROTOCOL

    def __init__(self, request_direction: Direction) -> None:
        self.request_direction = request_direction
        self.kind = ExchangeKind.for_request(request_direction)
        self.parse_errors = 0
        self._buffers = {Direction.INGRESS: b"", Direction.EGRESS: b""}
        self._pending: dict[str, ToyExchange] = {}

    def feed(self, direction: Direction, data: bytes, ts_ns: int, missing: int = 0) -> list[SessionEvent]:
        out: list[SessionEvent] = []
        buffer = self._buffers[direction] + data
        *lines, rest = buffer.split(b"\n")
        if len(rest) > MAX_LINE or missing:
            self.parse_errors += 1
            rest = b""
        self._buffers[direction] = rest
        for line in lines:
            self._line(direction, line, ts_ns, out)
        return out

    def _line(self, direction: Direction, line: bytes, ts_ns: int, out: list[SessionEvent]) -> None:
        words = line.decode("latin-1").split()
        if direction == self.request_direction and len(words) >= 3 and words[0] == "REQ":
            exchange = ToyExchange(words[1], words[2], ts_ns, self.kind)
            exchange.headers = [tuple(w.split("=", 1)) for w in words[3:] if "=" in w]  # type: ignore[misc]
            self._pending[exchange.request_id] = exchange
            out.append(ExchangeStarted(exchange))
            if len(self._pending) > MAX_PENDING:
                oldest = next(iter(self._pending))
                out.append(abandon(self._pending.pop(oldest), Outcome.EVICTED, ts_ns))
        elif direction != self.request_direction and len(words) == 3 and words[0] == "REP":
            exchange = self._pending.pop(words[1], None)
            if exchange is None:
                self.parse_errors += 1
                return
            exchange.status, exchange.reply_ns = words[2], ts_ns
            out.append(ExchangeProgress(exchange, Phase.RESPONSE_START, ts_ns))
            out.append(ExchangeCompleted(exchange))
        else:
            self.parse_errors += 1

    def close(self, ts_ns: int) -> list[SessionEvent]:
        pending, self._pending = list(self._pending.values()), {}
        return [abandon(exchange, Outcome.CONNECTION_CLOSED, ts_ns) for exchange in pending]


class ToyDetector(Detector):
    protocol = PROTOCOL
    transports = Transport.STREAM | Transport.DATAGRAM

    def detect(self, direction: Direction, data: bytes) -> Direction | None:
        if data.startswith(b"REQ "):
            return direction
        if data.startswith(b"REP "):
            return direction.opposite
        return None

    def new_session(self, request_direction: Direction) -> ToySession:
        return ToySession(request_direction)
