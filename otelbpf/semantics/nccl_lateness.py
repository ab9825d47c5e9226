"""How late each rank entered each NCCL collective, marked on the collective spans.

A collective finishes when its last rank arrives, so the rank that entered
last held the others back. The span of one rank's collective usually leaves
the pipeline before the other ranks' (each process's calls arrive on their
own), so the spans of a collective are *held* here until every rank's span of
that collective is in; then each gets ``otelbpf.nccl.lateness`` (its entry
minus the first rank's, ns) and ``otelbpf.nccl.last_to_enter``, and all leave
together (the lateness histogram ``otelbpf.nccl.collective.lateness`` is fed
from those attributes, otelbpf/metrics/gpu.py).

Only collectives of a communicator whose every rank joined in a traced
process on this node are held (otelbpf.semantics.gpu.StragglerDetector knows
them), or whose first rank joined less than ``timeout_ns`` before (ranks do
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

from collections import OrderedDict
from dataclasses import dataclass, field

from otelbpf import semconv as sc
from otelbpf.core.model import SpanRecord

#: A collective waits this long for its other ranks' spans at most.
HOLD_TIMEOUT_NS = 2_000_000_000
#: Spans held at once, at most (the oldest collectives leave unmarked beyond).
MAX_HELD_SPANS = 4096
UNMATCHED = "otelbpf.nccl.spans.unmatched"


@dataclass(frozen=True, slots=True)
class Entry:
    """One rank's entry into one collective of a communicator matched across processes."""

    unique_id: str
    seq: int
    rank: int
    nranks: int
    ts_ns: int


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
