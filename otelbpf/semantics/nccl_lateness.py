"""How late each rank entered each NCCL collective: marked on the collective spans, and a
rank that is last time after time named in the agent's log.

A collective finishes when its last rank arrives, so the rank that entered
last held the others back. The span of one rank's collective usually leaves
the pipeline before the other ranks' (each process's calls arrive on their
own), so the spans of a collective are *held* here until every rank's span of
that collective is in; then each gets ``otelbpf.nccl.lateness`` (its entry
minus the first rank's, ns) and ``otelbpf.nccl.last_to_enter``, and all leave
together (the lateness histogram ``otelbpf.nccl.collective.lateness`` is fed
from those attributes, otelbpf/metrics/gpu.py).

Ranks are matched across processes by :class:`StragglerDetector`: a
communicator by its ncclUniqueId (read at ncclCommInitRank), a collective by
its sequence number on it (every rank calls them in the same order). It gives
each collective call its :class:`Entry`, and names a rank that holds a
communicator back again and again.

Only collectives of a communicator whose every rank joined in a traced
process on this node are held (the detector knows them), or whose first rank joined less than ``timeout_ns`` before (ranks do
not wait for each other at set-up: a rank's first collective may come before
another rank's ncclCommInitRank). A communicator with ranks on other nodes
would never complete: past that, its spans pass at once, unmarked. A held collective that does not complete within
``timeout_ns`` (a rank that stopped calling, a call the agent missed) or that
is pushed out by ``max_spans`` leaves unmarked, counted in
``otelbpf.nccl.spans.unmatched``. The timeout is checked whenever a span
passes, at the pipeline's ticks (after each batch, and once a second on an
idle agent) and when the pipeline finishes.

The timeout runs on the events' clock (the latest span end or tick seen),
never on the agent's: an agent that stalls (starved of CPU on a busy node,
or busy scanning a new process's libraries) must not let a collective go
unmatched whose ranks' calls all returned within a millisecond.
"""

from __future__ import annotations

import logging
import statistics
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from otelbpf import semconv as sc
from otelbpf.core.model import SpanRecord

#: A collective waits this long for its other ranks' spans at most.
HOLD_TIMEOUT_NS = 2_000_000_000
#: Spans held at once, at most (the oldest collectives leave unmarked beyond).
MAX_HELD_SPANS = 4096
UNMATCHED = "otelbpf.nccl.spans.unmatched"

log = logging.getLogger("otelbpf")


@dataclass(frozen=True, slots=True)
class Entry:
    """One rank's entry into one collective of a communicator matched across processes."""

    unique_id: str
    seq: int
    rank: int
    nranks: int
    ts_ns: int


# -- ranks matched across processes, and the slow one named -----------------------------------

#: Collectives judged per communicator (the last ones), and how many before any verdict.
STRAGGLER_WINDOW = 30
STRAGGLER_MIN_SEEN = 10
#: A rank is named when it entered last in at least this share of the window...
STRAGGLER_SHARE = 0.8
#: ... with a median lateness of at least this (below it, last is scheduling noise).
STRAGGLER_MIN_LATE_NS = 1_000_000
#: A rank is named again for the same communicator no sooner than this.
STRAGGLER_REPEAT_NS = 60_000_000_000
#: Collectives waiting for the other ranks' entries, at most (the oldest are dropped).
MAX_OPEN_COLLECTIVES = 4096

_OP_PLURALS = {"AllReduce": "all-reduces", "AllGather": "all-gathers", "ReduceScatter": "reduce-scatters",
               "Broadcast": "broadcasts", "Send": "sends", "Recv": "receives"}


@dataclass
class _Member:
    """One rank's handle of a communicator, in its process."""

    unique_id: str
    rank: int
    nranks: int
    seq: int = 0


class StragglerDetector:
    """Which rank holds a communicator's collectives back, across the ranks'
    processes on this node.

    A communicator is matched across processes by its ncclUniqueId (read at
    ncclCommInitRank); each rank's n-th collective on it is the same
    collective (NCCL requires every rank to call them in the same order).
    When every rank's entry of a collective is in, the rank that entered last
    (and so spends the least time inside, waiting for nobody) is noted with
    how late it was (its entry minus the median of the others'). A rank last
    in at least 80% of the last 30 collectives, with a median lateness of at
    least 1 ms, is named in the agent's log; no rank is named otherwise.
    """

    def __init__(self, counters=None) -> None:
        self.counters = counters
        self.members: dict[tuple[int, int], _Member] = {}
        #: unique id -> ranks that joined it in traced processes (to know when all are on this node),
        #: and when the first of them did; kept until its last member left (a rank that destroyed its
        #: handle may be seen before a peer's last collective: the peer's span is still held)
        self.joined_ranks: dict[str, set[int]] = {}
        self.first_joined_ns: dict[str, int] = {}
        #: unique id -> members (process handles) still joined
        self.live_members: dict[str, int] = {}
        #: (unique id, seq) -> rank -> entry ns
        self.open: OrderedDict[tuple[str, int], dict[int, int]] = OrderedDict()
        #: unique id -> deque of (last rank, lateness ns, operation)
        self.history: dict[str, deque] = {}
        #: (unique id, rank) -> when it was last named
        self.named: dict[tuple[str, int], int] = {}
        #: the warning the last enter() logged (None: none)
        self.last_line: str | None = None

    def joined(self, pid: int, comm: int, unique_id: str, rank: int, nranks: int, ts_ns: int = 0) -> None:
        if 1 < nranks <= 65536 and 0 <= rank < nranks:
            if (pid, comm) in self.members:  # a handle address reused without its destroy seen
                self.left(pid, comm)
            self.members[(pid, comm)] = _Member(unique_id, rank, nranks)
            self.joined_ranks.setdefault(unique_id, set()).add(rank)
            self.first_joined_ns.setdefault(unique_id, ts_ns)
            self.live_members[unique_id] = self.live_members.get(unique_id, 0) + 1

    def left(self, pid: int, comm: int) -> None:
        """A rank's handle destroyed (or its process gone). The communicator's ranks are
        remembered until its last member leaves: events of different processes are handled in
        time order only within the reordering window, so one rank's ncclCommDestroy can come
        before another rank's last collective, which must still be held to be matched."""
        member = self.members.pop((pid, comm), None)
        if member is not None:
            remaining = self.live_members.get(member.unique_id, 1) - 1
            if remaining > 0:
                self.live_members[member.unique_id] = remaining
            else:
                self.live_members.pop(member.unique_id, None)
                self.joined_ranks.pop(member.unique_id, None)
                self.first_joined_ns.pop(member.unique_id, None)

    def forget(self, pid: int) -> None:
        for key in [k for k in self.members if k[0] == pid]:
            self.left(*key)

    def may_all_be_here(self, entry: Entry) -> bool:
        """Every rank of the entry's communicator joined in a traced process on this node, or
        may still be seen joining: the first rank joined less than the hold's timeout before
        (ranks do not wait for each other at set-up, so one rank's first collective can come
        before another's ncclCommInitRank). A communicator with ranks on other nodes is
        then no longer held."""
        if len(self.joined_ranks.get(entry.unique_id, ())) >= entry.nranks:
            return True
        return entry.ts_ns - self.first_joined_ns.get(entry.unique_id, entry.ts_ns) < HOLD_TIMEOUT_NS

    def entered(self, pid: int, comm: int, operation: str, ts_ns: int) -> str | None:
        """A collective entered by one rank; the warning line if this completes a verdict naming a rank."""
        entry = self.enter(pid, comm, operation, ts_ns)
        return self.last_line if entry is not None else None

    def enter(self, pid: int, comm: int, operation: str, ts_ns: int) -> Entry | None:
        """A collective entered by one rank: which collective of which communicator (None: a
        communicator whose set-up was not seen). Sets ``last_line`` to the warning this verdict
        logged, if any."""
        self.last_line = None
        member = self.members.get((pid, comm))
        if member is None:
            return None
        member.seq += 1
        entry = Entry(member.unique_id, member.seq, member.rank, member.nranks, ts_ns)
        key = (member.unique_id, member.seq)
        entries = self.open.get(key)
        if entries is None:
            entries = self.open[key] = {}
            if len(self.open) > MAX_OPEN_COLLECTIVES:
                self.open.popitem(last=False)
        entries[member.rank] = ts_ns
        if len(entries) >= member.nranks:
            del self.open[key]
            self.last_line = self._judge(member, entries, operation, ts_ns)
        return entry

    def _judge(self, member: _Member, entries: dict[int, int], operation: str, now_ns: int) -> str | None:
        last_rank = max(entries, key=entries.__getitem__)
        others = [ts for rank, ts in entries.items() if rank != last_rank]
        lateness = entries[last_rank] - statistics.median(others)
        history = self.history.setdefault(member.unique_id, deque(maxlen=STRAGGLER_WINDOW))
        history.append((last_rank, lateness, operation))
        if len(history) < STRAGGLER_MIN_SEEN:
            return None
        counts: dict[int, int] = {}
        for rank, _late, _op in history:
            counts[rank] = counts.get(rank, 0) + 1
        rank, times = max(counts.items(), key=lambda item: item[1])
        if times < STRAGGLER_SHARE * len(history):
            return None
        median_late = statistics.median(late for r, late, _op in history if r == rank)
        if median_late < STRAGGLER_MIN_LATE_NS:
            return None
        named = (member.unique_id, rank)
        if now_ns - self.named.get(named, -STRAGGLER_REPEAT_NS) < STRAGGLER_REPEAT_NS:
            return None
        self.named[named] = now_ns
        operations = {op for _r, _l, op in history}
        what = _OP_PLURALS.get(operation, "collectives") if len(operations) == 1 else "collectives"
        line = (
            f"otelbpf: straggler: rank {rank} of communicator {member.unique_id[:8]}… entered last in {times} of "
            f"{len(history)} {what} (median {median_late / 1e6:.0f} ms late)"
        )
        log.warning("%s", line)
        if self.counters is not None:
            self.counters.add("otelbpf.nccl.stragglers_named")
        return line


# -- the hold ---------------------------------------------------------------------------------


@dataclass
class _Collective:
    nranks: int
    held_since_ns: int
    #: rank -> (its span, its entry time)
    spans: dict[int, tuple[SpanRecord, int]] = field(default_factory=dict)


class CollectiveHold:
    """Holds the spans of one collective until all its ranks' spans are in, then marks them."""

    def __init__(self, counters=None, timeout_ns: int = HOLD_TIMEOUT_NS, max_spans: int = MAX_HELD_SPANS) -> None:
        self.counters = counters
        self.timeout_ns = timeout_ns
        self.max_spans = max_spans
        #: The events' clock: the latest span end or tick time seen (ns), never taken back.
        self.now_ns = 0
        #: (unique id, sequence number) -> the collective's spans so far, oldest first
        self.collectives: OrderedDict[tuple[str, int], _Collective] = OrderedDict()
        self.held = 0

    def add(self, span: SpanRecord, entry: Entry, now_ns: int | None = None) -> list[SpanRecord]:
        """Hold ``span``; the spans that may leave now (its collective's, marked, once complete).
        ``now_ns``: the events' clock now (default: the span's end)."""
        self.advance(span.end_ns if now_ns is None else now_ns)
        key = (entry.unique_id, entry.seq)
        collective = self.collectives.get(key)
        if collective is None:
            collective = self.collectives[key] = _Collective(entry.nranks, self.now_ns)
        if entry.rank in collective.spans:  # sequence numbers out of step (a call missed): do not guess
            self._count(1)
            return [span]
        collective.spans[entry.rank] = (span, entry.ts_ns)
        self.held += 1
        out: list[SpanRecord] = []
        if len(collective.spans) >= collective.nranks:
            del self.collectives[key]
            self.held -= len(collective.spans)
            out = _marked(collective)
        while self.held > self.max_spans and self.collectives:
            out += self._drop_oldest()
        return out

    def advance(self, now_ns: int) -> None:
        """The events' clock moved to ``now_ns`` (ignored if behind)."""
        if now_ns > self.now_ns:
            self.now_ns = now_ns

    def expire(self, everything: bool = False, now_ns: int = 0) -> list[SpanRecord]:
        """Let go, unmarked, of collectives held past the timeout on the events' clock, advanced
        to ``now_ns`` first (all of them with ``everything``)."""
        self.advance(now_ns)
        out: list[SpanRecord] = []
        if not self.collectives:
            return out
        deadline = self.now_ns - self.timeout_ns
        while self.collectives:
            oldest = next(iter(self.collectives.values()))
            if not everything and oldest.held_since_ns > deadline:
                break
            out += self._drop_oldest()
        return out

    def _drop_oldest(self) -> list[SpanRecord]:
        _key, collective = self.collectives.popitem(last=False)
        self.held -= len(collective.spans)
        self._count(len(collective.spans))
        return [span for span, _ts in collective.spans.values()]

    def _count(self, spans: int) -> None:
        if self.counters is not None:
            self.counters.add(UNMATCHED, spans)


def _marked(collective: _Collective) -> list[SpanRecord]:
    """Every rank's span with its lateness after the first rank and whether it entered last."""
    first = min(ts for _span, ts in collective.spans.values())
    last_rank = max(collective.spans, key=lambda rank: collective.spans[rank][1])
    out = []
    for rank, (span, ts) in collective.spans.items():
        span.attributes[sc.OTELBPF_NCCL_LATENESS] = ts - first
        span.attributes[sc.OTELBPF_NCCL_LAST_TO_ENTER] = rank == last_rank
        out.append(span)
    return out
