"""Linking spans into traces: who is whose parent.

A span's identity is fixed when its request starts, so children seen before
their parent ends can point at it. The rules, in order of precedence
(README "How spans are linked"):

1. **Propagated context** (``propagated``): a W3C ``traceparent``, Jaeger
   ``uber-trace-id`` or B3 header in the request makes the span a child of the
   span it names.
2. **Connection pair** (``connection``), SERVER spans: the traced process at
   the other end of the same connection wrote this request as a CLIENT span:
   that span is the parent. Both ends are matched by their socket tuple (TCP,
   also across network namespaces on one host) or by socket identity (Unix).
3. **asyncio task** (``task``), CLIENT spans made inside an asyncio task step
   (known from the PyIter_Send probes): the parent is the request whose
   response that same task writes next, provided the request had started
   before the call. Decided when that response is written; until then the
   call's spans (and the spans linked under it) are held back.
4. **Thread** (``thread``), CLIENT spans: the calling thread read exactly one
   request that is still being served: that request's SERVER span is the
   parent (thread-per-request servers, gunicorn sync workers, thread pools
   whose worker reads its own request).
5. **Message** (``message``), CONSUMER/SERVER spans of a protocol whose
   exchanges name their message agent-wide (``message_key``: RTPS writer
   GUID + sequence number): the span is *linked* to the span of the
   message's sending, whichever sockets carried it (one sample may have many
   readers), and also its child when the exchange says it has exactly one
   reader (``sole_reader``). The sending span stays findable after it ended
   (bounded, oldest out first), and every reader may claim it. A receive
   seen before its send (a local datagram can be read on another CPU before
   the sender's syscall returns; several readers of one multicast) waits for
   it: when the send comes, the waiting spans not yet built get the link
   (not the parent: their children may already have their trace).
6. **Process** (``process``), CLIENT spans from a thread that serves no
   request itself (hand-off to a worker pool): when exactly one request is
   being served in the whole process, it is the parent. Threads seen calling
   out while no request was open are background threads and never linked
   this way.

Across nodes (docs/cross-node.md), the kernel fixes a request's ids when it
is read or written (bpf/propagate.c) and its data event carries them
(``wire``, a :class:`~otelbpf.core.events.WireContext`):

* a SERVER span whose request came with the upstream agent's TCP option is
  its child (``tcp_option``: the trace, and the parent span, of the other
  node), after a propagated header and a same-host client; with no context
  on the wire it still takes the trace id the kernel chose for it, which
  the kernel puts on the calls it makes while serving it;
* a CLIENT span whose request carried a context takes its span id and trace:
  the other node's SERVER span names them. Its parent is found by the rules
  above as ever, and the kernel, which mirrors the thread and process rules,
  agrees; where it does not (an asyncio task decided later, a request it
  could not see), the span keeps the wire's ids as a root of that trace,
  with a span link to the parent the rules found (``conflict``, counted in
  ``otelbpf.propagation.conflicts``). A trace whose id went on the wire
  (``TraceGroup.wired``) never moves into another.

Library calls (``start_call``) may be placed by their family instead of the
process rule or a root when their thread serves no request: GPU calls go to
the thread's engine step, a span linked to every request in flight
(otelbpf/semantics/gpu_steps.py); ``window_observers`` hear requests open
and close for that.

When the evidence names several candidates, or a task's decision finds no
response, the span stays a root and ``otelbpf.association.ambiguous`` counts
it: a wrong parent is worse than none. Spans carry ``otelbpf.association``
saying which rule linked them (or ``ambiguous``).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from otelbpf.core.events import ContextOrigin
from otelbpf.core.identity import SpanStart, TraceGroup
from otelbpf.core.model import SpanKind, SpanLink, SpanRecord, new_span_id, new_trace_id
from otelbpf.core.propagation import extract_parent
from otelbpf.core.selfmetrics import Counters

PROPAGATED = "propagated"
CONNECTION = "connection"
TASK = "task"
THREAD = "thread"
PROCESS = "process"
MESSAGE = "message"
AMBIGUOUS = "ambiguous"
TCP_OPTION = "tcp_option"
CONFLICT = "conflict"
_FROM_OPTION = int(ContextOrigin.TCP_OPTION)

MAX_BACKGROUND_THREADS = 4096
MAX_PENDING_CLIENTS = 65536
MAX_TASK_DECISIONS = 65536
#: Sent messages remembered for their readers (message rule), oldest out first.
MAX_SENT_MESSAGES = 65536
#: A task's call is given up on this long after it completed with no
#: response written by its task (the handler normally answers right away).
TASK_DECISION_TIMEOUT_NS = 10_000_000_000
#: A SERVER span that found no CLIENT span on its connection may still get
#: one: on loopback the receiver can read a request before the sender's
#: send is stamped (its wake-up ran in ksoftirqd, or the sender was preempted
#: in between, bpf/socket.c woken_sk), so the client's start comes a little
#: after the server's. A client start on the same pair, this soon after and
#: while that server span is still open, adopts it.
LATE_CLIENT_WINDOW_NS = 50_000_000


@dataclass
class _ProcessState:
    """What the linker knows of one process. Read twice per request (its request
    windows open and close): an extension type when compiled (association.pxd),
    written as a dataclass over ``__init__`` and ``__slots__`` (DEVELOPERS.md)."""

    __slots__ = ("by_thread", "open_count", "background", "task_calls")
    #: Open SERVER spans by the thread that read their request.
    by_thread: dict[int, list[SpanStart]]
    open_count: int
    #: Threads that made calls while the process served nothing.
    background: OrderedDict
    #: CLIENT spans made in asyncio tasks, waiting for their task's response.
    task_calls: list[SpanStart]

    def __init__(self, by_thread=None, open_count=0, background=None, task_calls=None) -> None:
        self.by_thread = {} if by_thread is None else by_thread
        self.open_count = open_count
        self.background = OrderedDict() if background is None else background
        self.task_calls = [] if task_calls is None else task_calls


#: Span kinds whose process received the request or message: they open a
#: window (work done while serving it may be its child) and claim their sender.
_RECEIVING = frozenset({SpanKind.SERVER, SpanKind.CONSUMER})
#: Span kinds whose process sent it: offered to the receiving end for pairing.
_SENDING = frozenset({SpanKind.CLIENT, SpanKind.PRODUCER})


def pair_key(conn, kind: SpanKind) -> tuple | None:
    """The same value for both ends of one connection, seen from either end.

    TCP/UDP: (transport, server addr, server port, client addr, client port);
    a CONSUMER pairs like a SERVER, a PRODUCER like a CLIENT. Unix: the
    server end's socket identity (a client learns it at its first write).
    """
    if kind == _CONSUMER:
        kind = _SERVER
    elif kind == _PRODUCER:
        kind = _CLIENT
    if conn.peer_port and conn.local_port:
        transport = "udp" if conn.datagram else "tcp"
        if kind == _SERVER:
            return (transport, conn.local_addr, conn.local_port, conn.peer_addr, conn.peer_port)
        return (transport, conn.peer_addr, conn.peer_port, conn.local_addr, conn.local_port)
    if kind == _SERVER and conn.sock_id:
        return ("unix", conn.sock_id)
    if kind == _CLIENT and conn.peer_sock_id:
        return ("unix", conn.peer_sock_id)
    return None


# Members read once: ``SpanKind.SERVER`` is an attribute look-up on the enum class each time.
_SERVER = SpanKind.SERVER
_CLIENT = SpanKind.CLIENT
_PRODUCER = SpanKind.PRODUCER
_CONSUMER = SpanKind.CONSUMER


class Linker:
    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        self._processes: dict[int, _ProcessState] = {}
        #: CLIENT spans whose server end has not claimed them yet, by pair key.
        self._pending_clients: dict[tuple, deque[SpanStart]] = {}
        self._pending_count = 0
        #: id(SpanStart) -> pair key of a pending client (to withdraw it).
        self._client_keys: dict[int, tuple] = {}
        #: The latest open SERVER span of each pair key that found no client
        #: (LATE_CLIENT_WINDOW_NS), removed when it ends (kept until the
        #: connection's next request, every closed connection's last span would
        #: stay in memory); emptied when it grows past MAX_PENDING_CLIENTS keys.
        self._orphan_servers: dict[tuple, SpanStart] = {}
        self._task_decisions = 0
        #: id(SpanStart) of undecided task calls -> when their exchange
        #: completed (0 while it is still running).
        self._task_call_done: dict[int, int] = {}
        #: Sending spans of messages, by the exchange's ``message_key``.
        self._sent_messages: OrderedDict[tuple, SpanStart] = OrderedDict()
        #: Receiving spans seen before their message's sending span, by
        #: ``message_key``: (span, whether it is the message's sole reader).
        self._unsent_messages: OrderedDict[tuple, list[tuple[SpanStart, bool]]] = OrderedDict()
        #: Told of every request window that opens (``opened(start)``) and
        #: closes (``closed(start, ts_ns)``): GPU engine steps link the
        #: requests in flight (otelbpf/semantics/gpu_steps.py).
        self.window_observers: list = []
        #: Told when an asyncio task answers a request (``answered(start, ts_ns,
        #: task_id)``): profiles link that task's samples to it.
        self.answer_observers: list = []

    # -- starts -----------------------------------------------------------------

    def start(
        self, conn, exchange, kind: SpanKind, pid: int, tid: int, ts_ns: int, task_id: int = 0, wire=None
    ) -> SpanStart:
        """Identity and parent of the span of ``exchange`` (an ``Exchange`` of
        protocols/base.py), which started at ``ts_ns`` on ``conn``; ``wire``: the
        ids the kernel fixed for its request (a WireContext), or None."""
        remote = extract_parent(exchange.carrier())
        message = exchange.message_key
        pair = Linker._pair(conn, exchange, kind) if message is None else None
        receiving = kind in _RECEIVING
        if message is not None and receiving and remote is None:
            start = self._receive_message(message, exchange.sole_reader, kind, pid, tid)
        elif remote is not None:
            # a client's own header wins; the span keeps the id the kernel put on the wire, if any
            span_id = wire.span_id if wire is not None and not receiving else new_span_id()
            start = SpanStart(TraceGroup(remote.trace_id, remote.trace_state), span_id, remote.span_id, kind, pid, tid, PROPAGATED)
            if receiving:
                self._claim_client(pair)  # consume the pair so it cannot match a later request
        elif receiving:
            start = self._server_start(pair, kind, pid, tid, wire)
        else:
            start = self._client_start(kind, pid, tid, task_id, None, wire)
        start.start_ns = ts_ns
        start.task_id = task_id
        if receiving:
            self._open_window(start)
        elif message is not None:
            self._remember_message(message, start)
        elif kind in _SENDING and not (self._orphan_servers and self._adopt_orphan(pair, start, ts_ns)):
            self._remember_client(pair, start)
        return start

    def start_call(self, pid: int, tid: int, ts_ns: int, task_id: int = 0, off_request=None) -> SpanStart:
        """Identity of an INTERNAL span for a library call (CUDA, NCCL, ...)
        made by ``tid`` at ``ts_ns``: under the request that thread serves.
        ``off_request()``, if given, places a call made outside any asyncio
        task on a thread that serves no request (its library's own grouping:
        a GPU engine step) in place of the process rule or a root; it may
        return None."""
        start = self._client_start(SpanKind.INTERNAL, pid, tid, task_id, off_request)
        start.start_ns = ts_ns
        start.task_id = task_id
        return start

    @staticmethod
    def _pair(conn, exchange, kind: SpanKind) -> tuple | None:
        """The key both ends of the exchange compute alike: the connection's
        pair key, qualified by the exchange's correlation key when it has one
        (an HTTP/2 stream id, ...)."""
        key = pair_key(conn, kind)
        correlation = exchange.correlation_key
        if key is None or correlation is None:
            return key
        return (key, correlation)

    def _server_start(self, pair: tuple | None, kind: SpanKind, pid: int, tid: int, wire=None) -> SpanStart:
        client = self._claim_client(pair)
        if client is not None:
            return SpanStart(client.group, new_span_id(), client.span_id, kind, pid, tid, CONNECTION)
        if wire is None:
            start = SpanStart(TraceGroup(new_trace_id()), new_span_id(), b"", kind, pid, tid)
        elif wire.origin == _FROM_OPTION:  # the upstream node's CLIENT span is the parent
            start = SpanStart(TraceGroup(wire.trace_id), new_span_id(), wire.span_id, kind, pid, tid, TCP_OPTION)
            self.counters.add("otelbpf.propagation.adopted")
        else:  # the trace the kernel chose: its calls downstream carry it
            start = SpanStart(TraceGroup(wire.trace_id), new_span_id(), b"", kind, pid, tid)
        if pair is not None:
            orphans = self._orphan_servers
            if len(orphans) >= MAX_PENDING_CLIENTS:
                orphans.clear()
                self.counters.add("otelbpf.association.orphans_evicted", MAX_PENDING_CLIENTS)
            orphans[pair] = start
            start.awaits_client = pair
        return start

    def _adopt_orphan(self, key: tuple | None, client: SpanStart, ts_ns: int) -> bool:
        """``client`` started on a connection whose server end already began
        its request without one (LATE_CLIENT_WINDOW_NS): that server span
        becomes its child, its trace joining the client's."""
        if key is None:
            return False
        server = self._orphan_servers.get(key)
        if server is None or not 0 <= ts_ns - server.start_ns <= LATE_CLIENT_WINDOW_NS:
            return False
        del self._orphan_servers[key]
        server.awaits_client = None
        if not self._is_open(server):
            return False
        if not server.group.can_join(client.group):  # its trace went on the wire with a call: it stays
            self.counters.add("otelbpf.propagation.conflicts")
            return False
        server.parent_span_id = client.span_id
        server.association = CONNECTION
        server.group.merge_into(client.group)
        self.counters.add("otelbpf.association.late_clients")
        return True

    def _receive_message(self, message: tuple, sole_reader: bool, kind: SpanKind, pid: int, tid: int) -> SpanStart:
        """A received message: linked to its sending span, and its child if it has one reader."""
        sender = self._sent_messages.get(message)
        if sender is None:
            start = SpanStart(TraceGroup(new_trace_id()), new_span_id(), b"", kind, pid, tid)
            self._await_sender(message, start, sole_reader)
            return start
        if sole_reader:
            start = SpanStart(sender.group, new_span_id(), sender.span_id, kind, pid, tid, MESSAGE)
        else:
            start = SpanStart(TraceGroup(new_trace_id()), new_span_id(), b"", kind, pid, tid, MESSAGE)
        start.links = [sender]
        return start

    def _await_sender(self, message: tuple, start: SpanStart, sole_reader: bool) -> None:
        """``start`` received ``message`` before its sending was seen (a local
        datagram read on another CPU before the sender's syscall returned):
        it is linked, and parented, if that comes (``_sender_seen``)."""
        waiting = self._unsent_messages
        readers = waiting.get(message)
        if readers is None:
            waiting[message] = [(start, sole_reader)]
            if len(waiting) > MAX_SENT_MESSAGES:  # senders never seen (not traced): no loss to count
                waiting.popitem(last=False)
        else:
            readers.append((start, sole_reader))

    def _remember_message(self, message: tuple, start: SpanStart) -> None:
        sent = self._sent_messages
        sent[message] = start
        if len(sent) > MAX_SENT_MESSAGES:
            sent.popitem(last=False)
            self.counters.add("otelbpf.association.messages_evicted")
        if self._unsent_messages:
            for reader, sole_reader in self._unsent_messages.pop(message, ()):
                self._sender_seen(reader, sole_reader, start)

    def _sender_seen(self, reader: SpanStart, sole_reader: bool, sender: SpanStart) -> None:
        """The sending span of a message ``reader`` received earlier: what
        ``_receive_message`` would have given it, the parent only while the
        reader's span is open."""
        reader.links = [sender]
        reader.association = MESSAGE
        if sole_reader and self._is_open(reader):
            self._parent_late(reader, sender)
        else:
            self.counters.add("otelbpf.association.messages_linked_late")

    def message_completed(self, reader: SpanStart, exchange) -> None:
        """A received message's exchange is ending (before ``end``): a reader
        linked to its sender but not its child, because discovery had not yet
        counted the topic's readers when it started (Cyclone DDS may send a
        new writer's first sample before announcing the writer), becomes the
        child now if the exchange turned out to have one reader."""
        if reader.links and not reader.parent_span_id and exchange.sole_reader and self._is_open(reader):
            self._parent_late(reader, reader.links[0])

    def _parent_late(self, reader: SpanStart, sender: SpanStart) -> None:
        """``sender`` becomes the parent of ``reader``, an open span (so
        nothing of its trace has left yet): its trace, with the spans already
        placed under it, joins the sender's, as a late client's server does
        (``_adopt_orphan``)."""
        if not reader.group.can_join(sender.group):
            self.counters.add("otelbpf.propagation.conflicts")
            return
        reader.parent_span_id = sender.span_id
        reader.group.merge_into(sender.group)
        self.counters.add("otelbpf.association.messages_parented_late")

    def _client_start(self, kind: SpanKind, pid: int, tid: int, task_id: int, off_request=None, wire=None) -> SpanStart:
        if task_id and self._task_decisions < MAX_TASK_DECISIONS:
            return self._task_call(kind, pid, tid, wire)
        parent, how = self._in_process_parent(pid, tid)
        if wire is not None:
            return self._wired_client(parent, how, kind, pid, tid, wire)
        if off_request is not None and how != THREAD:
            placed = off_request()
            if placed is not None:
                return placed
        if parent is not None:
            return SpanStart(parent.group, new_span_id(), parent.span_id, kind, pid, tid, how)
        start = SpanStart(TraceGroup(new_trace_id()), new_span_id(), b"", kind, pid, tid)
        if how == AMBIGUOUS:
            start.association = AMBIGUOUS
            self.counters.add("otelbpf.association.ambiguous")
        return start

    def _wired_client(self, parent: SpanStart | None, how: str, kind: SpanKind, pid: int, tid: int, wire) -> SpanStart:
        """A CLIENT span whose request carried the kernel's context: the wire's ids,
        under ``parent`` when it is in the wire's trace (the kernel took the same
        request by the same rule), else a root of that trace linked to it."""
        if parent is not None and parent.group.trace_id == wire.trace_id:
            parent.group.root().wired = True
            return SpanStart(parent.group, wire.span_id, parent.span_id, kind, pid, tid, how)
        group = TraceGroup(wire.trace_id)
        group.wired = True
        start = SpanStart(group, wire.span_id, b"", kind, pid, tid)
        if parent is not None:
            start.association = CONFLICT
            start.links = [parent]
            self.counters.add("otelbpf.propagation.conflicts")
        elif how == AMBIGUOUS:
            start.association = AMBIGUOUS
            self.counters.add("otelbpf.association.ambiguous")
        return start

    def _task_call(self, kind: SpanKind, pid: int, tid: int, wire=None) -> SpanStart:
        """A call from an asyncio task: its parent is decided when the task answers.
        With the kernel's context (``wire``) its ids are the wire's from the start."""
        group = TraceGroup(new_trace_id() if wire is None else wire.trace_id)
        group.pending = 1
        group.wired = wire is not None
        start = SpanStart(group, new_span_id() if wire is None else wire.span_id, b"", kind, pid, tid)
        self._state(pid).task_calls.append(start)
        self._task_call_done[id(start)] = 0
        self._task_decisions += 1
        return start

    def _in_process_parent(self, pid: int, tid: int) -> tuple[SpanStart | None, str]:
        state = self._processes.get(pid)
        if state is None or state.open_count == 0:
            self._mark_background(pid, tid)
            return None, ""
        on_thread = state.by_thread.get(tid)
        if on_thread:
            if len(on_thread) == 1:
                return on_thread[0], THREAD
            return None, AMBIGUOUS
        if tid in state.background:
            return None, ""
        if state.open_count == 1:
            only = next(windows[0] for windows in state.by_thread.values() if windows)
            return only, PROCESS
        return None, AMBIGUOUS

    def _mark_background(self, pid: int, tid: int) -> None:
        state = self._state(pid)
        state.background[tid] = None
        state.background.move_to_end(tid)
        if len(state.background) > MAX_BACKGROUND_THREADS:
            state.background.popitem(last=False)

    # -- windows and pairs ----------------------------------------------------

    def _state(self, pid: int) -> _ProcessState:
        state = self._processes.get(pid)
        if state is None:
            state = self._processes[pid] = _ProcessState()
        return state

    def _open_window(self, start: SpanStart) -> None:
        state = self._state(start.pid)
        state.by_thread.setdefault(start.tid, []).append(start)
        state.open_count += 1
        for observer in self.window_observers:
            observer.opened(start)

    def _remember_client(self, key: tuple | None, start: SpanStart) -> None:
        if key is None:
            return
        if self._pending_count >= MAX_PENDING_CLIENTS:
            self.counters.add("otelbpf.association.pending_evicted")
            return
        self._pending_clients.setdefault(key, deque()).append(start)
        self._client_keys[id(start)] = key
        self._pending_count += 1

    def _claim_client(self, key: tuple | None) -> SpanStart | None:
        if key is None:
            return None
        queue = self._pending_clients.get(key)
        if not queue:
            return None
        client = queue.popleft()  # HTTP/1.1 answers in order: the oldest unclaimed request
        self._forget_client(client, key, queue)
        return client

    def _forget_client(self, client: SpanStart, key: tuple, queue: deque) -> None:
        self._client_keys.pop(id(client), None)
        self._pending_count -= 1
        if not queue:
            del self._pending_clients[key]

    # -- ends -----------------------------------------------------------------

    def end(self, start: SpanStart, ts_ns: int, task_id: int = 0) -> list[TraceGroup]:
        """The exchange completed at ``ts_ns`` (its last bytes written from
        ``task_id``). Returns groups whose pending decisions are now all made."""
        if start.kind in _RECEIVING:
            settled = self._answer_task_calls(start, ts_ns, task_id) if task_id else []
            if task_id and self.answer_observers:
                for observer in self.answer_observers:
                    observer.answered(start, ts_ns, task_id)
            if start.awaits_client is not None:
                self._stop_awaiting_client(start)
            self._close_window(start)
            for observer in self.window_observers:
                observer.closed(start, ts_ns)
            return settled
        key = self._client_keys.get(id(start))
        if key is not None:
            queue = self._pending_clients[key]
            _remove_identical(queue, start)
            self._forget_client(start, key, queue)
        if id(start) in self._task_call_done:
            self._task_call_done[id(start)] = ts_ns
        return []

    def _stop_awaiting_client(self, server: SpanStart) -> None:
        """``server`` ended: no late client may adopt it now, so the linker lets go of it."""
        key = server.awaits_client
        server.awaits_client = None
        if self._orphan_servers.get(key) is server:
            del self._orphan_servers[key]

    def _is_open(self, start: SpanStart) -> bool:
        """Is ``start``'s request window still open (its exchange not ended)?"""
        state = self._processes.get(start.pid)
        windows = state.by_thread.get(start.tid) if state is not None else None
        return bool(windows) and any(window is start for window in windows)

    def _close_window(self, start: SpanStart) -> None:
        state = self._processes.get(start.pid)
        if state is None:
            return
        windows = state.by_thread.get(start.tid)
        if windows and _remove_identical(windows, start):
            state.open_count -= 1
            if not windows:
                del state.by_thread[start.tid]

    def _answer_task_calls(self, server: SpanStart, ts_ns: int, task_id: int) -> list[TraceGroup]:
        """The task ``task_id`` answered ``server``'s request: its calls made
        since that request started belong to it."""
        state = self._processes.get(server.pid)
        if state is None or not state.task_calls:
            return []
        settled = []
        keep = []
        for call in state.task_calls:
            if call.task_id == task_id and server.start_ns <= call.start_ns <= ts_ns:
                settled.extend(self._decide(call, server))
            else:
                keep.append(call)
        state.task_calls = keep
        return settled

    def _decide(self, call: SpanStart, parent: SpanStart | None) -> list[TraceGroup]:
        """Make a task call's pending decision: link it under ``parent`` or leave it a root."""
        self._task_decisions -= 1
        self._task_call_done.pop(id(call), None)
        if parent is not None and not call.group.can_join(parent.group):
            # its ids went on the wire in another trace than its request's: a root of its own, linked
            call.association = CONFLICT
            call.links = [parent]
            self.counters.add("otelbpf.propagation.conflicts")
            root = call.group.root()
            if call.span is not None:  # already finished and held
                call.span.links.append(SpanLink(parent.trace_id, parent.span_id))
        elif parent is not None:
            call.parent_span_id = parent.span_id
            call.association = TASK
            root = call.group.merge_into(parent.group)
        else:
            call.association = AMBIGUOUS
            self.counters.add("otelbpf.association.ambiguous")
            root = call.group.root()
        if call.span is not None:  # already finished and held: amend it
            call.span.parent_span_id = call.parent_span_id
            call.span.attributes["otelbpf.association"] = call.association
        root.pending -= 1
        return [root] if root.pending == 0 else []

    def expire(self, now_ns: int, everything: bool = False) -> list[TraceGroup]:
        """Give up on task calls that finished long ago with no answer from
        their task (or all of them: process gone, agent stopping)."""
        settled: list[TraceGroup] = []
        if not self._task_decisions:
            return settled
        for state in self._processes.values():
            if not state.task_calls:
                continue
            keep = []
            for call in state.task_calls:
                done = self._task_call_done.get(id(call), 0)
                if everything or (done and now_ns - done > TASK_DECISION_TIMEOUT_NS):
                    settled.extend(self._decide(call, None))
                else:
                    keep.append(call)
            state.task_calls = keep
        return settled

    def forget_process(self, pid: int) -> list[TraceGroup]:
        state = self._processes.pop(pid, None)
        if state is None:
            return []
        settled = []
        for call in state.task_calls:
            settled.extend(self._decide(call, None))
        return settled

    def serving(self, pid: int, tid: int, task_id: int = 0) -> SpanStart | None:
        """The request ``tid`` is serving now, for a profile sample: the one
        window open on the thread, or the request whose own task is running
        (``task_id``, when the task that read the request is the one running);
        None when no window or several could be meant (an unlinked sample is
        better than a wrong one). Unlike a library call, the process rule does
        not apply: another thread's request is no evidence."""
        state = self._processes.get(pid)
        if state is None or state.open_count == 0:
            return None
        if task_id:
            for windows in state.by_thread.values():
                for window in windows:
                    if window.task_id == task_id:
                        return window
            return None
        windows = state.by_thread.get(tid)
        if windows and len(windows) == 1:
            return windows[0]
        return None

    def serves_requests(self, pid: int) -> bool:
        """Does ``pid`` have a request window open?"""
        state = self._processes.get(pid)
        return state is not None and state.open_count > 0

    def open_requests(self):
        """Every receiving span whose window is open, for an observer that starts late."""
        for state in self._processes.values():
            for windows in state.by_thread.values():
                yield from windows

    @property
    def open_windows(self) -> int:
        return sum(state.open_count for state in self._processes.values())

    @property
    def pending_clients(self) -> int:
        return self._pending_count

    @property
    def servers_awaiting_clients(self) -> int:
        """Open SERVER spans that found no CLIENT span and may still be adopted by a late one."""
        return len(self._orphan_servers)

    @property
    def pending_task_calls(self) -> int:
        return self._task_decisions


def hold_or_release(span: SpanRecord, start: SpanStart) -> list[SpanRecord]:
    """The spans that can leave now: ``span`` itself unless its trace waits
    for a decision, in which case it is held with its group (and ``start``
    keeps it, for that decision to amend). A span that leaves is not kept:
    identities outlive their spans (a sent message's, for its readers), and
    must not keep every finished record alive with them."""
    root = start.group.root()
    if root.pending:
        start.span = span
        root.held.append(span)
        return []
    return [span]


def release(group: TraceGroup) -> list[SpanRecord]:
    """A group's decisions are all made: its held spans leave, in its final trace."""
    root = group.root()
    held, root.held = root.held, []
    trace_id, trace_state = root.trace_id, root.trace_state
    for span in held:
        span.trace_id = trace_id
        span.trace_state = trace_state
    return held


def _remove_identical(items, target) -> bool:
    """Remove ``target`` itself (not an equal copy) from a list or deque."""
    for index, item in enumerate(items):
        if item is target:
            del items[index]
            return True
    return False
