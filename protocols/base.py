"""The contract every protocol module keeps.

A protocol module is sans-IO: the agent feeds it the bytes one traced process
read or wrote on one connection, in order, with timestamps, and gets back
exchange notifications. It never touches sockets, eBPF or OpenTelemetry, so
it runs the same on live capture, on a pcap file and under a fuzzer.

Each protocol package (``protocols/http1``, ...) provides:

* a **detector**: given the first bytes seen in one direction, is this me, and
  which direction carries the requests;
* a **parser** per direction: ``feed(data, ts_ns, missing)`` -> messages;
* a **stitcher** that pairs requests with responses into exchanges and reports
  them through a :class:`Session`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Protocol


class Direction(enum.IntEnum):
    """Which way bytes moved, seen from the traced process."""

    INGRESS = 0  # the process read them (recv/read)
    EGRESS = 1  # the process wrote them (send/write)

    @property
    def opposite(self) -> "Direction":
        return Direction.EGRESS if self is Direction.INGRESS else Direction.INGRESS


@dataclass(slots=True)
class ExchangeStarted:
    """A request's head has been parsed: assign span IDs now.

    Emitted once per exchange, before :class:`ExchangeCompleted`, so that
    work done while the request is being served can name it as parent.
    """

    exchange: Any


@dataclass(slots=True)
class ExchangeCompleted:
    """The exchange is over (response finished, or it ended abnormally)."""

    exchange: Any


SessionEvent = ExchangeStarted | ExchangeCompleted


class Session(Protocol):
    """One connection's protocol state, as seen from one traced process."""

    protocol: str
    #: Count of malformed inputs skipped (never raised).
    parse_errors: int

    def feed(self, direction: Direction, data: bytes, ts_ns: int, missing: int = 0) -> list[SessionEvent]:
        """Feed bytes that moved in ``direction`` at ``ts_ns``.

        ``missing`` counts bytes that followed ``data`` in the stream but
        were not captured (payload truncated to the capture size, or sent by
        sendfile); the parser accounts for them without seeing them.
        Must never raise on any input.
        """
        ...

    def close(self, ts_ns: int) -> list[SessionEvent]:
        """The connection ended: finish what can be finished, end the rest."""
        ...


class Detector(Protocol):
    """Recognises a protocol by content, never by port."""

    name: str

    def detect(self, direction: Direction, data: bytes) -> Direction | None:
        """Return the direction that carries requests if ``data`` (the first
        bytes seen moving in ``direction``) opens this protocol, else None."""
        ...

    def new_session(self, request_direction: Direction) -> Session:
        ...
