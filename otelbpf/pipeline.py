"""Events in, spans out: the agent's per-event path.

source events -> ConnectionTable (protocol sessions) -> exchange started:
fix the span's identity -> exchange completed: build the span -> span sink
(the batch processor). Everything here runs on one thread, the agent's main
loop; nothing in it blocks.
"""

from __future__ import annotations

import logging
from typing import Iterable, Protocol

from otelbpf.association import Linker, hold_or_release, release
from otelbpf.connections import Connection, ConnectionTable
from otelbpf.events import ConnClose, ConnOpen, ConnPeer, DataEvent, Event, LostEvents, ProcessExit
from otelbpf.model import SpanKind, SpanRecord
from otelbpf.resources import ProcessResources
from otelbpf.selfmetrics import Counters
from otelbpf.identity import SpanStart
from otelbpf.spans import PrivacyOptions, http_span
from protocols import detectors as all_detectors
from protocols.base import Detector, Direction, ExchangeCompleted, ExchangeStarted, SessionEvent

log = logging.getLogger("otelbpf.pipeline")


class SpanConsumer(Protocol):
    def on_end(self, span: SpanRecord) -> None: ...


class Pipeline:
    def __init__(
        self,
        consumer: SpanConsumer,
        resources: ProcessResources,
        counters: Counters,
        privacy: PrivacyOptions | None = None,
        max_connections: int = 16384,
        detectors: Iterable[Detector] | None = None,
        on_unrecognized=None,
        on_new_process=None,
        on_process_exit=None,
    ) -> None:
        self.consumer = consumer
        self.resources = resources
        self.counters = counters
        self.privacy = privacy or PrivacyOptions()
        #: Told when a traced process is first seen / has exited (the eBPF
        #: source attaches / detaches per-process probes).
        self.on_new_process = on_new_process
        self.on_process_exit = on_process_exit
        self.linker = Linker(counters)
        self.table = ConnectionTable(
            detectors if detectors is not None else all_detectors(),
            self._on_session_events,
            counters,
            max_connections=max_connections,
            on_unrecognized=on_unrecognized,
        )
        #: Spans whose request started and has not completed: id(exchange) -> start.
        self._open: dict[int, SpanStart] = {}
        #: Spans built during the current handle() call (one counter update per batch).
        self._spans_built = 0
        self.last_ts_ns = 0

    def handle(self, events: list[Event]) -> None:
        self.counters.add("otelbpf.events", len(events))
        table = self.table
        truncated = 0
        for event in events:
            kind = type(event)
            if kind is DataEvent:
                if event.total_len > len(event.data) and not event.flags:
                    truncated += 1
                table.data(event)
            elif kind is ConnOpen:
                if self.resources.observe(event.pid, event.comm) and self.on_new_process is not None:
                    self.on_new_process(event.pid)
                table.open(event)
            elif kind is ConnClose:
                table.close(event.conn_id, event.ts_ns)
            elif kind is ConnPeer:
                table.peer(event.conn_id, event.peer_sock_id)
            elif kind is ProcessExit:
                table.close_process(event.pid, event.ts_ns)
                self._release(self.linker.forget_process(event.pid))
                self.resources.mark_exited(event.pid)
                if self.on_process_exit is not None:
                    self.on_process_exit(event.pid)
            elif kind is LostEvents:
                self.counters.add("otelbpf.events.lost", event.count)
                continue
            self.last_ts_ns = event.ts_ns
        if truncated:
            self.counters.add("otelbpf.payload.truncated", truncated)
        self._count_spans()
        if self.linker.pending_task_calls:
            self._release(self.linker.expire(self.last_ts_ns))

    def finish(self, ts_ns: int | None = None) -> None:
        """End every connection (agent stopping): open exchanges become spans,
        undecided links are given up, held spans leave."""
        self.table.close_all(ts_ns or self.last_ts_ns)
        self._release(self.linker.expire(self.last_ts_ns, everything=True))
        self._count_spans()

    def _count_spans(self) -> None:
        if self._spans_built:
            self.counters.add("otelbpf.spans.created", self._spans_built)
            self._spans_built = 0

    # -- session events -------------------------------------------------------

    def _on_session_events(self, conn: Connection, event: DataEvent | None, out: list[SessionEvent]) -> None:
        for item in out:
            if type(item) is ExchangeStarted:
                self._start(conn, event, item.exchange)
            elif type(item) is ExchangeCompleted:
                self._complete(conn, event, item.exchange)

    def _start(self, conn: Connection, event: DataEvent | None, exchange) -> None:
        """The request's head is parsed: fix the span's identity and parent now."""
        direction = event.direction if event is not None else Direction.INGRESS
        kind = SpanKind.SERVER if direction == Direction.INGRESS else SpanKind.CLIENT
        tid = event.tid if event is not None else conn.pid
        ts = event.ts_ns if event is not None else exchange.start_ns
        task_id = event.task_id if event is not None else 0
        self._open[id(exchange)] = self.linker.start(conn, exchange.request.headers, kind, conn.pid, tid, ts, task_id)

    def _complete(self, conn: Connection, event: DataEvent | None, exchange) -> None:
        start = self._open.pop(id(exchange), None)
        if start is None:  # pragma: no cover - sessions always start before completing
            log.debug("exchange completed without a start on conn %s", conn.conn_id)
            return
        ts = event.ts_ns if event is not None else exchange.end_ns
        settled = self.linker.end(start, ts, event.task_id if event is not None else 0)
        if exchange.end_reason != "complete":
            self.counters.add("otelbpf.exchanges.incomplete", label=exchange.end_reason)
        span = http_span(start, exchange, conn, self.privacy)
        self._spans_built += 1
        self._emit(hold_or_release(span, start))
        self._release(settled)

    def _release(self, groups) -> None:
        for group in groups:
            self._emit(release(group))

    def _emit(self, spans: list[SpanRecord]) -> None:
        for span in spans:
            self.consumer.on_end(span)
