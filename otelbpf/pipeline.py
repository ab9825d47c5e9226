"""Events in, spans out: the agent's per-event path.

source events -> handler table (one handler per event family) ->
ConnectionTable (protocol sessions) -> exchange started: fix the span's
identity (otelbpf.association) -> exchange ended: the protocol's semantics
builds the span (otelbpf.semantics) -> span consumer (metrics, batch
processor). Library calls seen by uprobes go to the call semantics of their
library. Everything here runs on one thread, the agent's main loop; nothing
in it blocks.

The exchange lifecycle is enforced here, not trusted to each session: every
exchange that started ends exactly once. One a session leaves open when its
connection closes, is evicted or its process exits is ended by the pipeline
(outcome = why the connection ended) and counted in
``otelbpf.exchanges.unended{protocol}``; its linking window closes with it,
so no later call can be parented to a dead span. A second end of the same
exchange, or an end without a start, is counted in
``otelbpf.protocol.violations{protocol}`` (docs/architecture.md).
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Callable, Protocol

from otelbpf.core.association import MESSAGE, Linker, hold_or_release, release
from otelbpf.core.connections import Connection, ConnectionTable
from otelbpf.core.events import (
    CallEvent,
    ConnClose,
    ContextOrigin,
    ConnOpen,
    ConnPeer,
    DataEvent,
    DatagramEvent,
    Event,
    LostEvents,
    ProcessExit,
    ProcessStart,
)
from otelbpf.core.identity import SpanStart
from otelbpf.core.model import SpanKind, SpanLink, SpanRecord
from otelbpf.core.selfmetrics import Counters
from otelbpf.host.resources import ProcessResources
from otelbpf.registry import Registry, default_registry
from otelbpf.semantics.common import SpanOptions
from protocols.base import (
    Exchange,
    ExchangeAbandoned,
    ExchangeCompleted,
    ExchangeProgress,
    ExchangeStarted,
    Outcome,
    ProgressFilter,
    SessionEvent,
)

log = logging.getLogger("otelbpf.pipeline")

#: SpanKind by number: an exchange's kind (ExchangeKind, same numbers) without an enum call per span.
_SPAN_KINDS = {kind.value: kind for kind in SpanKind}
#: DataFlags.PIECE as a plain int: a record of a call captured whole, in pieces.
_PIECE = 8
#: DataFlags.TRACE_CTX: the record carried a request's ids (no bearing on truncation).
_TRACE_CTX = 16
_CLIENT_KIND = int(SpanKind.CLIENT)
_CLIENT_CONTEXT = int(ContextOrigin.CLIENT)

_COMPLETE = Outcome.COMPLETE  # read once, not off the enum class per span

#: At most this many session reports, or finished spans, wait for their pass in a batch: a
#: backlog drained at once (tens of thousands of events) is passed in slices of this size, so
#: memory stays bounded and the export queue is fed as it was. A drain at 10k req/s is ~200 events.
PASS_LIMIT = 1024


class SpanConsumer(Protocol):
    def on_end(self, span: SpanRecord) -> None: ...


#: Told of every progress event of a protocol's exchanges (e.g. streamed
#: chunks for time-to-first-token), with the exchange's identity.
ProgressObserver = Callable[[SpanStart, ExchangeProgress], None]


def _any_of(filters: list[ProgressFilter | None]) -> ProgressFilter | None:
    """One filter accepting what any of ``filters`` accepts (None if one is None)."""
    if any(f is None for f in filters):
        return None
    if len(filters) == 1:
        return filters[0]
    chosen = tuple(filters)
    return lambda exchange: any(f(exchange) for f in chosen)


class Pipeline:
    def __init__(
        self,
        consumer: SpanConsumer,
        resources: ProcessResources,
        counters: Counters,
        privacy: SpanOptions | None = None,
        max_connections: int = 16384,
        registry: Registry | None = None,
        on_unrecognized=None,
        on_new_process=None,
        on_process_exit=None,
        on_wants_bodies=None,
    ) -> None:
        self.consumer = consumer
        self.resources = resources
        self.counters = counters
        self.options = privacy or SpanOptions()
        self.registry = registry if registry is not None else default_registry()
        #: Told when a traced process is first seen / has exited (the eBPF
        #: source attaches / detaches per-process probes).
        self.on_new_process = on_new_process
        self.on_process_exit = on_process_exit
        #: Told (with the Connection) the first time an exchange on a connection reports
        #: progress (its bodies are read: an LLM call): the eBPF source then captures the
        #: connection's big reads and writes whole (bpf/socket.c, emit_whole).
        self.on_wants_bodies = on_wants_bodies
        self.linker = Linker(counters)
        self.table = ConnectionTable(
            self.registry.detectors(),
            self._on_session_events,
            counters,
            max_connections=max_connections,
            on_unrecognized=on_unrecognized,
            on_ended=self._end_leftovers,
        )
        #: Observers of progress events, by protocol id (see observe_progress).
        self.progress_observers: dict[str, list[ProgressObserver]] = {}
        #: Their filters, in the same order (None: every exchange).
        self._progress_wanted: dict[str, list[ProgressFilter | None]] = {}
        #: Spans whose exchange started and has not ended: id(exchange) -> start.
        self._open: dict[int, SpanStart] = {}
        #: Each protocol's span semantics once found in the registry (asked per span).
        self._semantics: dict[str, object] = {}
        #: Spans built during the current handle() call (one counter update per batch).
        self._spans_built = 0
        #: Inside handle(): sessions' reports wait in _reported for the association pass,
        #: finished spans in _finished until the batch is done (handle's docstring).
        self._batching = False
        self._reported: list[tuple[Connection, object, list[SessionEvent]]] = []
        self._finished: list[SpanRecord] = []
        #: id(exchange) -> the kernel's ids its request took (cross-node propagation): bound in
        #: the parsing pass, when the exchange starts, taken by the association pass of the batch.
        self._wired: dict[int, object] = {}
        self.last_ts_ns = 0
        #: Called after each batch with the event clock, and with
        #: ``everything=True`` when the agent stops: work that ends by time
        #: (GPU engine steps, otelbpf/semantics/gpu_steps.py).
        self.tick_hooks: list[Callable[[int, bool], None]] = []
        #: Called with a pid after a traced process exited (and the source forgot it).
        self.exit_hooks: list[Callable[[int], None]] = []
        #: Called when the agent stops, after every connection ended (profiles export what they hold).
        self.finish_hooks: list[Callable[[], None]] = []
        #: The handler of each event family: a new family is a new entry here.
        self._handlers: dict[type, Callable] = {
            DataEvent: self._on_data,
            DatagramEvent: self._on_datagram,
            ConnOpen: self._on_open,
            ConnClose: self._on_close,
            ConnPeer: self._on_peer,
            ProcessStart: self._on_process_start,
            ProcessExit: self._on_process_exit,
            CallEvent: self._on_call,
            LostEvents: self._on_lost,
        }

    def add_calls(self, semantics) -> None:
        """Make spans of a library's calls (``CallEvent.library``) with ``semantics`` (a
        ``CallSemantics``): how a feature adds a call family (GPU: CUDA and NCCL)."""
        self.registry.register_calls(semantics)

    def wrap_consumer(self, wrap: Callable[[SpanConsumer], SpanConsumer]) -> SpanConsumer:
        """Put ``wrap(consumer)`` in front of the consumer: how a feature that must see (or
        hold back) every finished span before it leaves attaches (GPU: launch counts written
        onto request spans). Returns the new consumer."""
        self.consumer = wrap(self.consumer)
        return self.consumer

    def add_handler(self, event_type: type, handler: Callable) -> None:
        """Handle events of ``event_type`` (a family from outside the core, e.g.
        profiles' stack samples) with ``handler``, in event order like the others."""
        self._handlers[event_type] = handler

    def observe_progress(
        self, protocol: str, observer: ProgressObserver, wants: ProgressFilter | None = None
    ) -> None:
        """Call ``observer`` with every progress event of ``protocol``'s exchanges
        (first response byte, body chunks with their time), from sessions made
        from now on: the protocol's detector is told to report them.

        ``wants``, asked once per exchange when it starts, limits that to the
        exchanges it accepts, so the others cost nothing per chunk (a detector
        without ``progress_filter`` reports all; observers must not assume a
        filter ran). With several observers an exchange reports progress if
        any of them wants it."""
        observers = self.progress_observers.setdefault(protocol, [])
        observers.append(observer)
        wanted = self._progress_wanted.setdefault(protocol, [])
        wanted.append(wants)
        combined = _any_of(wanted)
        for detector in self.registry.detectors():
            if detector.protocol == protocol:
                detector.report_progress = True
                detector.progress_filter = combined

    # -- events -----------------------------------------------------------------

    def handle(self, events: list[Event]) -> None:
        """One batch of events, in three passes (DEVELOPERS.md, "Run each stage over the batch"):

        1. data events' bytes go to their connections' sessions (parsing), and what the
           sessions report waits in ``_reported``;
        2. that is associated and made into spans (``_associate``), before any other kind of
           event is handled and before a connection's session ends, so every step still sees
           the events in their order;
        3. the spans finished go to the consumer (``_deliver``), in the order they ended.

        Each pass runs its own code warm, item after item, instead of the whole agent's code
        once per request. A pass also runs as soon as ``PASS_LIMIT`` items wait for it (a
        backlog goes through in slices). A batch that fails midway still associates what it
        parsed and hands on what it finished."""
        self.counters.add("otelbpf.events", len(events))
        handlers = self._handlers
        self._truncated = 0
        self._batching = True
        try:
            for event in events:
                if type(event) is DataEvent:  # most of every batch: a direct call, not a bound method from the handler table
                    self._on_data(event)
                    continue
                if self._reported:
                    self._associate()
                handler = handlers.get(type(event))
                if handler is None:
                    self.counters.add("otelbpf.events.unknown")
                    continue
                handler(event)
            if self._reported:
                self._associate()
            if self._truncated:
                self.counters.add("otelbpf.payload.truncated", self._truncated)
            if self.linker.pending_task_calls:
                self._release(self.linker.expire(self.last_ts_ns))
        finally:
            try:
                if self._reported:
                    self._associate()
            finally:
                self._batching = False
                if self._wired:  # bound to exchanges that never started (shed)
                    self._wired.clear()
                self._count_spans()
                self._deliver()
        for tick in self.tick_hooks:
            tick(self.last_ts_ns, False)
        self._take_detector_counts()

    def _take_detector_counts(self) -> None:
        """What detectors counted during the batch (the fast path's share), into the self-metrics."""
        for name, amount, label in self.registry.take_counts():
            if amount:
                self.counters.add(name, amount, label=label)

    def _on_data(self, event: DataEvent) -> None:
        flags = event.flags & ~_TRACE_CTX
        if event.total_len > len(event.data) and (flags == 0 or flags == _PIECE):
            self._truncated += 1
        self.table.data(event)
        self.last_ts_ns = event.ts_ns

    def _on_datagram(self, event: DatagramEvent) -> None:
        if event.total_len > len(event.data):
            self._truncated += 1
        self.table.datagram(event)
        self.last_ts_ns = event.ts_ns

    def _on_open(self, event: ConnOpen) -> None:
        self._observe_process(event.pid, event.comm)
        self.table.open(event)
        self.last_ts_ns = event.ts_ns

    def _on_close(self, event: ConnClose) -> None:
        self.table.close(event.conn_id, event.ts_ns)
        self.last_ts_ns = event.ts_ns

    def _on_peer(self, event: ConnPeer) -> None:
        self.table.peer(event.conn_id, event.peer_sock_id)
        self.last_ts_ns = event.ts_ns

    def _on_process_start(self, event: ProcessStart) -> None:
        self._observe_process(event.pid, event.comm, event.exe)
        self.last_ts_ns = event.ts_ns

    def _on_process_exit(self, event: ProcessExit) -> None:
        self.table.close_process(event.pid, event.ts_ns)
        self._release(self.linker.forget_process(event.pid))
        self.resources.mark_exited(event.pid)
        if self.on_process_exit is not None:
            self.on_process_exit(event.pid)
        for hook in self.exit_hooks:
            hook(event.pid)
        self.last_ts_ns = event.ts_ns

    def _on_lost(self, event: LostEvents) -> None:
        self.counters.add("otelbpf.events.lost", event.count)

    def _on_call(self, event: CallEvent) -> None:
        """A library call: a span of its own, placed under the request its
        thread is serving (thread + time rules), if its library has semantics."""
        self.last_ts_ns = event.end_ns
        semantics = self.registry.call_semantics(event.library)
        if semantics is None:
            self.counters.add("otelbpf.calls.unhandled", label=event.library)
            return
        self._observe_process(event.pid, "")
        place = semantics.place_off_request  # e.g. GPU engine steps
        off_request = None if place is None else partial(place, event)
        start = self.linker.start_call(event.pid, event.tid, event.ts_ns, event.task_id, off_request)
        span = semantics.span(start, event)
        if span is None:
            return
        self._spans_built += 1
        self._emit(hold_or_release(span, start))

    def _observe_process(self, pid: int, comm: str, exe: str = "") -> None:
        if self.resources.observe(pid, comm, exe) and self.on_new_process is not None:
            self.on_new_process(pid)

    def tick_idle(self, now_ns: int) -> None:
        """No event for a while: let the time-based hooks (engine steps, held
        collective spans) see the clock move on, so an idle agent still ends
        what is due. ``now_ns`` is on the events' clock (wall-clock ns, as the decoder stamps them), and
        is never taken back behind the latest event."""
        if now_ns > self.last_ts_ns:
            for tick in self.tick_hooks:
                tick(now_ns, False)

    def finish(self, ts_ns: int | None = None) -> None:
        """End every connection (agent stopping): open exchanges become spans,
        undecided links are given up, held spans leave."""
        self.table.close_all(ts_ns or self.last_ts_ns)
        self._release(self.linker.expire(self.last_ts_ns, everything=True))
        for tick in self.tick_hooks:
            tick(self.last_ts_ns, True)
        self._count_spans()
        self._take_detector_counts()
        for hook in self.finish_hooks:
            hook()

    def _count_spans(self) -> None:
        if self._spans_built:
            self.counters.add("otelbpf.spans.created", self._spans_built)
            self._spans_built = 0

    # -- session events: the exchange lifecycle -------------------------------------

    def _on_session_events(self, conn: Connection, event, out: list[SessionEvent]) -> None:
        """What a connection's session reported: inside handle(), kept for the batch's
        association pass (handle's step 2); outside (finish, an idle tick), at once."""
        if conn.wire_ctx is not None:
            self._bind_wire(conn, out)
        if self._batching:
            reported = self._reported
            reported.append((conn, event, out))
            if len(reported) >= PASS_LIMIT:
                self._associate()
            return
        self._session_events(conn, event, out)

    def _bind_wire(self, conn: Connection, out: list[SessionEvent]) -> None:
        """The kernel's ids for a request (``conn.wire_ctx``) go to the first exchange that
        starts in the event that had them or after it, on that side: a CLIENT exchange
        for a client's ids, a SERVER one for a server's. Bound now, in the parsing pass,
        while ``conn.wire_ctx`` is still this event's; used when the exchange starts."""
        context = conn.wire_ctx
        client = context.origin == _CLIENT_CONTEXT
        for item in out:
            if type(item) is ExchangeStarted:
                exchange = item.exchange
                if exchange.start_ns >= conn.wire_ctx_ns and (exchange.kind == _CLIENT_KIND) == client:
                    self._wired[id(exchange)] = context
                    conn.wire_ctx = None
                    return

    def _associate(self) -> None:
        """Handle's step 2: what the sessions reported, in the order they reported it."""
        reported = self._reported
        self._reported = []
        for conn, event, out in reported:
            self._session_events(conn, event, out)

    def _session_events(self, conn: Connection, event, out: list[SessionEvent]) -> None:
        for item in out:
            kind = type(item)
            if kind is ExchangeStarted:
                started = item  # typed when compiled (pipeline.pxd): a C field read
                self._start(conn, event, started.exchange)
            elif kind is ExchangeProgress:
                self._progress(conn, item)
            elif kind is ExchangeCompleted:
                completed = item
                self._end(conn, event, completed.exchange)
            else:  # ExchangeAbandoned
                self._end(conn, event, item.exchange)

    def _start(self, conn: Connection, event, exchange: Exchange) -> None:
        """The request's head is parsed: fix the span's identity and parent now."""
        key = id(exchange)
        if conn.shed:  # shed for the CPU budget while this batch of session events was out
            return
        if key in self._open:
            self.counters.add("otelbpf.protocol.violations", label=exchange.protocol)
            return
        if type(event) is DataEvent:
            data_event = event  # typed when compiled (pipeline.pxd): C field reads
            tid, ts, task_id = data_event.tid, data_event.ts_ns, data_event.task_id
        elif event is not None:
            tid, ts, task_id = event.tid, event.ts_ns, event.task_id
        else:
            tid, ts, task_id = conn.pid, exchange.start_ns, 0
        wire = self._wired.pop(key, None) if self._wired else None
        start = self.linker.start(conn, exchange, _SPAN_KINDS[exchange.kind], conn.pid, tid, ts, task_id, wire)
        self._open[key] = start
        conn.exchanges[key] = exchange

    def _progress(self, conn: Connection, item: ExchangeProgress) -> None:
        observers = self.progress_observers.get(item.exchange.protocol)
        if not observers:
            return
        if not conn.wants_bodies:  # its first progress: capture its bodies whole from now on
            conn.wants_bodies = True
            if self.on_wants_bodies is not None:
                self.on_wants_bodies(conn)
        start = self._open.get(id(item.exchange))
        if start is None:
            if not conn.shed:  # a shed connection's exchange was never started: not a violation
                self.counters.add("otelbpf.protocol.violations", label=item.exchange.protocol)
            return
        for observe in observers:
            observe(start, item)

    def _end(self, conn: Connection, event, exchange: Exchange) -> None:
        key = id(exchange)
        start = self._open.pop(key, None)
        if start is None and conn.shed:
            return  # its start was skipped: the connection was shed just before
        if start is None:  # ended twice, or never started: the session broke the contract
            self.counters.add("otelbpf.protocol.violations", label=exchange.protocol)
            return
        conn.exchanges.pop(key, None)
        table = self.table
        if table.shed_permille and not conn.exchanges and table.sheddable(conn):
            table.shed(conn)  # over the CPU budget: stop here, between exchanges
        if type(event) is DataEvent:
            data_event = event
            ts, task_id = data_event.ts_ns, data_event.task_id
        elif event is not None:
            ts, task_id = event.ts_ns, event.task_id
        else:
            ts, task_id = exchange.end_ns, 0
        if start.association is MESSAGE and not start.parent_span_id:
            self.linker.message_completed(start, exchange)
        settled = self.linker.end(start, ts, task_id)
        outcome = exchange.outcome
        if outcome is not _COMPLETE:
            self.counters.add("otelbpf.exchanges.incomplete", label=outcome.value)
        span = self._build(start, exchange, conn)
        if span is not None:
            if start.links and not span.links:  # e.g. a CLIENT span whose wire context disagreed with its parent
                span.links = [SpanLink(linked.trace_id, linked.span_id) for linked in start.links]
            self._spans_built += 1
            self._emit(hold_or_release(span, start))
        self._release(settled)

    def _build(self, start: SpanStart, exchange: Exchange, conn: Connection) -> SpanRecord | None:
        semantics = self._semantics.get(exchange.protocol)
        if semantics is None:
            semantics = self.registry.semantics(exchange.protocol)
            if semantics is not None:
                self._semantics[exchange.protocol] = semantics
        if semantics is None:
            self.counters.add("otelbpf.spans.unmapped", label=exchange.protocol)
            return None
        try:
            return semantics.span(start, exchange, conn, self.options)
        except Exception:  # noqa: BLE001 - a mapping bug must cost a span, not the agent
            self.counters.add("otelbpf.spans.failed", label=exchange.protocol)
            log.exception("building a %s span failed (counted in otelbpf.spans.failed)", exchange.protocol)
            return None

    def _end_leftovers(self, conn: Connection, ts_ns: int) -> None:
        """The connection's session closed: end what it left open (after what it reported
        before, still waiting for the batch's association pass)."""
        if self._reported:
            self._associate()
        if not conn.exchanges:
            return
        leftovers = list(conn.exchanges.values())
        for exchange in leftovers:
            self.counters.add("otelbpf.exchanges.unended", label=exchange.protocol)
            exchange.outcome = conn.end_outcome
            exchange.abandoned_ns = max(ts_ns, exchange.start_ns)
            self._end(conn, None, exchange)

    def _release(self, groups) -> None:
        for group in groups:
            self._emit(release(group))

    def _emit(self, spans: list[SpanRecord]) -> None:
        """Hand finished spans on; inside handle(), after the batch's events (_deliver)."""
        if self._batching:
            finished = self._finished
            finished.extend(spans)
            if len(finished) >= PASS_LIMIT:
                self._deliver()
            return
        for span in spans:
            self.consumer.on_end(span)

    def _deliver(self) -> None:
        """The spans the batch finished, to the consumer, in the order they ended. Once per
        batch rather than once per span: the consumers' code then runs warm in the CPU's
        instruction cache, span after span, instead of cold between two requests' parsing
        (DEVELOPERS.md, "Run each stage over the batch")."""
        finished = self._finished
        if not finished:
            return
        self._finished = []
        on_end = self.consumer.on_end
        for span in finished:
            on_end(span)

    @property
    def open_exchanges(self) -> int:
        """Exchanges started and not yet ended (a gauge; bounded by the connection table)."""
        return len(self._open)
