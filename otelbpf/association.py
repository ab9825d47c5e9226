"""Linking spans into traces: who is whose parent, decided when a request starts.

Every span's identity (trace ID, span ID, parent) is fixed at its request's
start, so children seen before their parent ends can point at it. The rules,
in order of precedence (README "How spans are linked"):

1. **Propagated context** (``propagated``): a W3C ``traceparent``, Jaeger
   ``uber-trace-id`` or B3 header in the request makes the span a child of the
   span it names.
2. **Connection pair** (``connection``), SERVER spans: the traced process at
   the other end of the same connection wrote this request as a CLIENT span:
   that span is the parent. Both ends are matched by their socket tuple (TCP,
   also across network namespaces on one host) or by socket identity (Unix).
3. **Thread** (``thread``), CLIENT spans: the calling thread read exactly one
   request that is still being served: that request's SERVER span is the
   parent (thread-per-request servers, gunicorn sync workers, thread pools
   whose worker reads its own request).
4. **Process** (``process``), CLIENT spans from a thread that serves no
   request itself (hand-off to a worker pool): when exactly one request is
   being served in the whole process, it is the parent. Threads seen calling
   out while no request was open are background threads and never linked
   this way.

When the evidence names several candidates (an asyncio event loop serving
many requests on one thread, several requests open during a hand-off), the
span stays a root and ``otelbpf.association.ambiguous`` counts it: a wrong
parent is worse than none. Spans carry ``otelbpf.association`` saying which
rule linked them (or ``ambiguous``).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from otelbpf.model import SpanKind, new_span_id, new_trace_id
from otelbpf.propagation import extract_parent
from otelbpf.selfmetrics import Counters
from otelbpf.spans import SpanStart

PROPAGATED = "propagated"
CONNECTION = "connection"
THREAD = "thread"
PROCESS = "process"
AMBIGUOUS = "ambiguous"

#: Background-thread memory per process, and client starts awaiting their server end.
MAX_BACKGROUND_THREADS = 4096
MAX_PENDING_CLIENTS = 65536


@dataclass(slots=True)
class _ProcessState:
    #: Open SERVER spans by the thread that read their request.
    by_thread: dict[int, list[SpanStart]]
    open_count: int
    #: Threads that made calls while the process served nothing.
    background: OrderedDict[int, None]


def pair_key(conn, kind: SpanKind) -> tuple | None:
    """The same value for both ends of one connection, seen from either end.

    TCP: (server addr, server port, client addr, client port). Unix: the
    server end's socket identity (a client learns it at its first write).
    """
    if conn.peer_port and conn.local_port:
        if kind == SpanKind.SERVER:
            return ("tcp", conn.local_addr, conn.local_port, conn.peer_addr, conn.peer_port)
        return ("tcp", conn.peer_addr, conn.peer_port, conn.local_addr, conn.local_port)
    if kind == SpanKind.SERVER and conn.sock_id:
        return ("unix", conn.sock_id)
    if kind == SpanKind.CLIENT and conn.peer_sock_id:
        return ("unix", conn.peer_sock_id)
    return None


class Linker:
    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        self._processes: dict[int, _ProcessState] = {}
        #: CLIENT spans whose server end has not claimed them yet, by pair key.
        self._pending_clients: dict[tuple, deque[SpanStart]] = {}
        self._pending_count = 0
        #: id(SpanStart) -> pair key of a pending client (to withdraw it).
        self._client_keys: dict[int, tuple] = {}

    # -- starts ---------------------------------------------------------------

    def start(self, conn, headers, kind: SpanKind, pid: int, tid: int, ts_ns: int) -> SpanStart:
        remote = extract_parent(headers)
        if remote is not None:
            start = SpanStart(remote.trace_id, new_span_id(), remote.span_id, kind, pid, tid, remote.trace_state, PROPAGATED)
            if kind == SpanKind.SERVER:
                self._claim_client(conn)  # consume the pair so it cannot match a later request
        elif kind == SpanKind.SERVER:
            start = self._server_start(conn, pid, tid)
        else:
            start = self._client_start(pid, tid)
        if kind == SpanKind.SERVER:
            self._open_window(start)
        else:
            self._remember_client(conn, start)
        return start

    def _server_start(self, conn, pid: int, tid: int) -> SpanStart:
        client = self._claim_client(conn)
        if client is not None:
            return SpanStart(client.trace_id, new_span_id(), client.span_id, SpanKind.SERVER, pid, tid, client.trace_state, CONNECTION)
        return SpanStart(new_trace_id(), new_span_id(), b"", SpanKind.SERVER, pid, tid)

    def _client_start(self, pid: int, tid: int) -> SpanStart:
        parent, how = self._in_process_parent(pid, tid)
        if parent is None:
            start = SpanStart(new_trace_id(), new_span_id(), b"", SpanKind.CLIENT, pid, tid)
            if how == AMBIGUOUS:
                start.association = AMBIGUOUS
                self.counters.add("otelbpf.association.ambiguous")
            return start
        return SpanStart(parent.trace_id, new_span_id(), parent.span_id, SpanKind.CLIENT, pid, tid, parent.trace_state, how)

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
            state = self._processes[pid] = _ProcessState({}, 0, OrderedDict())
        return state

    def _open_window(self, start: SpanStart) -> None:
        state = self._state(start.pid)
        state.by_thread.setdefault(start.tid, []).append(start)
        state.open_count += 1

    def _remember_client(self, conn, start: SpanStart) -> None:
        key = pair_key(conn, SpanKind.CLIENT)
        if key is None:
            return
        if self._pending_count >= MAX_PENDING_CLIENTS:
            self.counters.add("otelbpf.association.pending_evicted")
            return
        self._pending_clients.setdefault(key, deque()).append(start)
        self._client_keys[id(start)] = key
        self._pending_count += 1

    def _claim_client(self, conn) -> SpanStart | None:
        key = pair_key(conn, SpanKind.SERVER)
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

    def end(self, start: SpanStart) -> None:
        """The exchange completed: close its window / withdraw its pending pair."""
        if start.kind == SpanKind.SERVER:
            state = self._processes.get(start.pid)
            if state is None:
                return
            windows = state.by_thread.get(start.tid)
            if windows and _remove_identical(windows, start):
                state.open_count -= 1
                if not windows:
                    del state.by_thread[start.tid]
            return
        key = self._client_keys.get(id(start))
        if key is not None:
            queue = self._pending_clients[key]
            _remove_identical(queue, start)
            self._forget_client(start, key, queue)

    def forget_process(self, pid: int) -> None:
        self._processes.pop(pid, None)

    @property
    def open_windows(self) -> int:
        return sum(state.open_count for state in self._processes.values())

    @property
    def pending_clients(self) -> int:
        return self._pending_count


def _remove_identical(items, target) -> bool:
    """Remove ``target`` itself (not an equal copy) from a list or deque."""
    for index, item in enumerate(items):
        if item is target:
            del items[index]
            return True
    return False
