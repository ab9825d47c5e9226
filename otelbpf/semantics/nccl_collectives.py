"""One trace per NCCL collective instance, on every node, with no agent talking to another;
and each rank's time between its collectives, split.

**Which instance.** NCCL requires every rank of a communicator to issue its collectives in
the same order, and counts them itself: ``comm->seqNumber[func]``, per function, from the
communicator's creation (what its RAS reports as collective counts and its profiler
plugins receive as ``seqNumber``). So (``commHash``, function, sequence number) names one
collective instance on every rank. Here:

* ``commHash`` is computed from the 128-byte ``ncclUniqueId`` read at
  ``ncclCommInitRank(Config)`` (protocols/nccl/comm_hash.py, per NCCL version: the
  library's version banner, otelbpf/sources/gpu.py);
* the sequence number is counted **in the kernel** at each call's entry, per (process,
  communicator handle, function) (bpf/calls.c ``comm_seqs``, ``CallEvent.comm_seq``):
  a record lost on the way to user space never shifts the numbers of the calls after
  it. The count restarts when a handle is set up, so for a communicator whose set-up
  the agent saw it is NCCL's own count (offset 0);
* the trace id is a hash of the three (:func:`collective_trace_id`), the same on every
  agent; each rank's span id a hash of the three and its rank (:func:`collective_span_id`):
  every rank's span of the instance lands in one trace, each rank's once.

**Who issued it.** The span leaves the trace of the request or engine step that made the
call (its would-be parent) and keeps a **span link** to that span instead. Why this
direction: the link is known when the collective's span is built (its parent's ids are),
a collective has one issuer, while an engine step issues many collectives (a request
more), past the 128 links a span keeps; and the link from the collective is what OTel
prescribes for work that is caused by one context but belongs to another.

**An agent that came late.** A handle whose set-up the agent did not see is counted from
its first call seen: its numbers are not NCCL's, and its spans stay where they were
(unjoined, counted in ``otelbpf.nccl.collectives.unjoined{reason}``) until NCCL's own count
aligns them: a RAS reply (otelbpf/sources/nccl_ras.py) lists each rank's pid and launched
count per function, gathered at one moment within the query's time window. For a handle
whose calls of a function all lie clear of that window, the offset between NCCL's count and
the kernel's is exact (:meth:`CollectiveTraces.align`); it is adopted only when two
successive replies agree on it while the handle made calls in between, and only one
communicator of the process fits. Otherwise the spans stay unjoined: a wrong join is
worse than none. Replies also check the handles whose set-up was seen; a lasting
disagreement (collectives NCCL did not count, as those captured in CUDA graphs) is
corrected to NCCL's count and counted in ``otelbpf.nccl.collectives.realigned``.

**Between collectives** (:class:`RankIntervals`): from a collective's return to its thread's
next collective's entry, the time is split into GPU waits (synchronisations, blocking and
pageable copies, on that thread), on-CPU and off-CPU time (the thread's off-CPU clock,
bpf/ranks.c, read at every GPU call's entry and return), so a backend can tell a rank that
is compute-, host- or communication-slow (docs/gpu.md, "Slow ranks across nodes").
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from otelbpf import semconv as sc
from otelbpf.core.events import CallEvent
from otelbpf.core.model import SpanLink, SpanRecord
from protocols.nccl.comm_hash import comm_hash, format_comm_hash
from protocols.nccl.ras import FUNCTIONS as RAS_FUNCTIONS

log = logging.getLogger("otelbpf")

#: Domain of the derived ids: a change of derivation changes it, so that agents of two
#: versions never put unrelated spans into one trace.
ID_DOMAIN = b"otelbpf.nccl.collective/1"
#: Communicator handles remembered (set up, or seen in a collective), and threads followed.
MAX_HANDLES = 65536
MAX_THREADS = 65536
#: Calls remembered per (handle, function) to place a RAS reply's window among them.
RECENT_CALLS = 64
UNJOINED = "otelbpf.nccl.collectives.unjoined"
REALIGNED = "otelbpf.nccl.collectives.realigned"
#: Why a collective's span was not joined (the counter's label, the span's attribute).
NOT_SET_UP = "setup_not_seen"
NOT_COUNTED = "not_counted"
NOT_ALIGNED = "not_aligned"


def collective_trace_id(comm: int, function: str, seq: int) -> bytes:
    """The trace of collective instance (commHash, NCCL function name, sequence number)."""
    digest = hashlib.blake2b(_instance_key(comm, function, seq), digest_size=16).digest()
    return digest if any(digest) else b"\x00" * 15 + b"\x01"


def collective_span_id(comm: int, function: str, seq: int, rank: int) -> bytes:
    """Rank ``rank``'s span of that instance."""
    key = _instance_key(comm, function, seq) + rank.to_bytes(4, "big", signed=True)
    digest = hashlib.blake2b(key, digest_size=8, person=b"rank").digest()
    return digest if any(digest) else b"\x00" * 7 + b"\x01"


def _instance_key(comm: int, function: str, seq: int) -> bytes:
    return ID_DOMAIN + comm.to_bytes(8, "big") + function.encode() + b"\0" + seq.to_bytes(8, "big")


@dataclass(frozen=True, slots=True)
class CollectiveInstance:
    """One rank's part of one collective instance."""

    comm: int
    function: str  # NCCL's name: AllReduce, Broadcast...
    seq: int
    rank: int
    nranks: int

    @property
    def trace_id(self) -> bytes:
        return collective_trace_id(self.comm, self.function, self.seq)

    @property
    def span_id(self) -> bytes:
        return collective_span_id(self.comm, self.function, self.seq, self.rank)


def join_instance(span: SpanRecord, instance: CollectiveInstance) -> None:
    """Move a collective's span into its instance's trace, linked to the span that issued it."""
    if span.parent_span_id:
        span.links.append(SpanLink(span.trace_id, span.parent_span_id))
    span.trace_id = instance.trace_id
    span.span_id = instance.span_id
    span.parent_span_id = b""
    span.trace_state = ""
    span.attributes[sc.OTELBPF_ASSOCIATION] = sc.OTELBPF_ASSOCIATION_COLLECTIVE


@dataclass
class _Handle:
    """A communicator handle of one process: NCCL's id for it, when known, and its calls."""

    comm: int | None = None
    rank: int = -1
    nranks: int = 0
    #: NCCL function name -> NCCL's count minus the kernel's (None: not aligned)
    offsets: dict[str, int] | None = None
    #: "setup" (its ncclCommInitRank was seen) or "ras" (aligned from NCCL's count)
    aligned_by: str = ""
    #: function -> recent calls (entry, return, kernel count), oldest first
    recent: dict[str, deque] = field(default_factory=dict)
    #: commHash -> (offsets, kernel counts) at the previous RAS reply (alignment evidence)
    evidence: dict[int, tuple[dict[str, int], dict[str, int]]] = field(default_factory=dict)


class CollectiveTraces:
    """Gives each collective call its instance (:meth:`instance`), from the set-ups seen
    (:meth:`joined`) and NCCL's own counts (:meth:`align`)."""

    def __init__(self, counters=None) -> None:
        self.counters = counters
        #: (pid, handle) -> what is known of it
        self.handles: OrderedDict[tuple[int, int], _Handle] = OrderedDict()
        #: (pid, handle) whose alignment was logged
        self._said: set[tuple[int, int]] = set()
        #: (commHash, rank) -> nranks of the joined handles, replaced whole when it changes (read by
        #: the metrics thread: :meth:`metric_points`)
        self.published: dict[tuple[int, int], int] = {}

    # -- set-up and calls --------------------------------------------------------------------

    def joined(self, pid: int, handle: int, unique_id: bytes, rank: int, nranks: int,
               version: tuple[int, int, int] | None) -> int | None:  # fmt: skip
        """``ncclCommInitRank(Config)`` returned ``handle``: the communicator's commHash (None:
        the id was not read whole). The kernel restarted the handle's counts."""
        if len(unique_id) != 128 or not 0 <= rank < nranks:
            return None
        comm = comm_hash(unique_id, version)
        self._put((pid, handle), _Handle(comm, rank, nranks, {}, "setup"))
        self._publish()
        return comm

    def left(self, pid: int, handle: int) -> None:
        if self.handles.pop((pid, handle), None) is not None:
            self._publish()

    def forget(self, pid: int) -> None:
        keys = [key for key in self.handles if key[0] == pid]
        for key in keys:
            del self.handles[key]
        if keys:
            self._publish()

    def _publish(self) -> None:
        self.published = {(h.comm, h.rank): h.nranks for h in self.handles.values()
                          if h.comm is not None and h.offsets is not None}  # fmt: skip

    def metric_points(self) -> list[tuple[str, str, str, str, list]]:
        """``otelbpf.nccl.ranks`` per joined rank: its communicator's size, so that a backend
        compares a communicator's ranks only when every one of them is measured."""
        points = [({sc.OTELBPF_NCCL_COMM_HASH: format_comm_hash(comm), sc.OTELBPF_NCCL_RANK: rank}, nranks)
                  for (comm, rank), nranks in sorted(self.published.items())]  # fmt: skip
        return [(sc.OTELBPF_NCCL_RANKS, "Ranks in the communicator, per rank traced here whose collectives are joined"
                 " across nodes", "{rank}", "gauge", points)]  # fmt: skip

    def instance(self, call: CallEvent, function: str, handle: int) -> tuple[CollectiveInstance | None, str]:
        """The instance of an ordered collective call (``function``: NCCL's name) on ``handle``,
        or None and why not."""
        key = (call.pid, handle)
        known = self.handles.get(key)
        if known is None:
            known = self._put(key, _Handle())
        if not call.comm_seq:
            return None, self._unjoined(NOT_COUNTED)
        recent = known.recent.get(function)
        if recent is None:
            recent = known.recent[function] = deque(maxlen=RECENT_CALLS)
        recent.append((call.ts_ns, call.end_ns, call.comm_seq))
        if known.comm is None or known.offsets is None:
            return None, self._unjoined(NOT_SET_UP if not known.aligned_by else NOT_ALIGNED)
        seq = call.comm_seq - 1 + known.offsets.get(function, 0)
        return CollectiveInstance(known.comm, function, seq, known.rank, known.nranks), ""

    def _put(self, key: tuple[int, int], handle: _Handle) -> _Handle:
        self.handles[key] = handle
        self.handles.move_to_end(key)
        if len(self.handles) > MAX_HANDLES:
            self.handles.popitem(last=False)
        return handle

    def _unjoined(self, reason: str) -> str:
        if self.counters is not None:
            self.counters.add(UNJOINED, label=reason)
        return reason

    # -- NCCL's own count --------------------------------------------------------------------

    def align(self, report, window: tuple[int, int], pids: dict[int, int]) -> None:
        """A RAS reply (:class:`protocols.nccl.ras.RasReport`, JSON: every rank's counts)
        gathered within ``window`` (start, end: the events' clock), about the processes
        ``pids`` (their pid here -> their pid as NCCL sees it, in its pid namespace). Call it
        once the events up to the window's end were handled."""
        by_process: dict[int, list[tuple[int, int]]] = {}
        for communicator in report.communicators:
            if not communicator.complete_counts:
                continue
            for rank in communicator.ranks:
                by_process.setdefault(rank.pid, []).append((communicator.comm_hash, rank.rank))
        start, end = window
        for (pid, handle_id), handle in list(self.handles.items()):
            nccl_pid = pids.get(pid)
            if nccl_pid is None:
                continue
            places = by_process.get(nccl_pid, [])
            kernel = {function: count for function in RAS_FUNCTIONS
                      if (count := _count_before(handle.recent.get(function), start, end)) is not None}  # fmt: skip
            if not kernel:
                continue
            fitting = []
            for comm, rank in places:
                if handle.comm is not None and comm != handle.comm:
                    continue
                if sum(1 for c, _r in places if c == comm) > 1:
                    continue  # two ranks of one communicator in this process: not told apart by pid
                communicator = report.communicator(comm)
                counts = next(r.counts for r in communicator.ranks if r.rank == rank)
                offsets = {f: counts[f] - k for f, k in kernel.items() if f in counts}
                previous = handle.evidence.get(comm)
                handle.evidence[comm] = (offsets, kernel)
                if previous is not None and _confirms(previous, offsets, kernel):
                    fitting.append((comm, rank, communicator.size, offsets))
            for comm in [c for c in handle.evidence if c not in {c for c, _r in places}]:
                del handle.evidence[comm]
            self._settle((pid, handle_id), handle, fitting)

    def _settle(self, key: tuple[int, int], handle: _Handle, fitting: list) -> None:
        if len(fitting) != 1:
            return
        comm, rank, size, offsets = fitting[0]
        if handle.comm is None or handle.offsets is None:
            if any(value < 0 for value in offsets.values()):
                return  # NCCL counted fewer than were seen since the agent came: not this communicator
            if any(other is not handle and other.comm == comm and other.rank == rank and k[0] == key[0]
                   for k, other in self.handles.items()):  # fmt: skip
                return  # another handle of the process holds that rank already
            handle.comm, handle.rank, handle.nranks = comm, rank, size
            handle.offsets, handle.aligned_by = dict(offsets), "ras"
            self._publish()
            if key not in self._said:
                self._said.add(key)
                log.info(
                    "NCCL ranks: pid %d, communicator %s rank %d of %d: set-up not seen, aligned on NCCL's counts (RAS)",
                    key[0], format_comm_hash(comm), rank, size,
                )
            return
        changed = {f: v for f, v in offsets.items() if handle.offsets.get(f, 0) != v}
        if changed:
            handle.offsets.update(changed)
            if self.counters is not None:
                self.counters.add(REALIGNED)
            log.warning(
                "NCCL ranks: pid %d, communicator %s: NCCL counted %s collectives than seen (%s); following NCCL's count",
                key[0], format_comm_hash(comm), "more" if max(changed.values()) > 0 else "fewer",
                ", ".join(f"{f} {v:+d}" for f, v in sorted(changed.items())),
            )  # fmt: skip


def _count_before(recent, start: int, end: int) -> int | None:
    """The kernel's count of the calls that returned before ``start``, when certain: the next
    call (the first the count does not include) is seen, and entered after ``end``. None when
    a call may have been in progress during the window (NCCL counts a call within it)."""
    if not recent:
        return None
    before = 0
    following = None
    for entry, returned, count in recent:
        if returned < start:
            before = count
        elif following is None:
            following = (entry, count)
    if following is None or following[0] <= end:
        return None
    if following[1] != before + 1:
        return None  # calls in between not among the recent ones
    return before


def _confirms(previous: tuple[dict[str, int], dict[str, int]], offsets: dict[str, int], kernel: dict[str, int]) -> bool:
    """Two replies agree: the same offset for every function measured both times, at least
    one such function, and calls made on the handle in between (an idle handle fits any
    idle communicator)."""
    before, before_kernel = previous
    common = [f for f in offsets if f in before]
    if not common or any(before[f] != offsets[f] for f in common):
        return False
    return any(kernel[f] > before_kernel.get(f, kernel[f]) for f in common)


# -- time between collectives ------------------------------------------------------------------


@dataclass(slots=True)
class Interval:
    """A rank's time from its previous collective's return to this one's entry, split (ns).
    ``on_cpu``/``off_cpu`` are None without the thread's off-CPU clock."""

    duration: int
    gpu_wait: int
    on_cpu: int | None
    off_cpu: int | None


@dataclass(slots=True)
class _Thread:
    pid: int
    last_end_ns: int
    #: the thread's off-CPU clock at the previous collective's return (-1: not clocked)
    last_off_cpu_ns: int
    gpu_wait_ns: int = 0
    #: off-CPU time inside those GPU waits (-1: some wait was not clocked)
    gpu_wait_off_cpu_ns: int = 0


class RankIntervals:
    """Per thread that issues collectives: what it did between two of them."""

    def __init__(self) -> None:
        self.threads: OrderedDict[int, _Thread] = OrderedDict()

    def gpu_wait(self, call: CallEvent) -> None:
        """A call on which the thread waited for the GPU (a synchronisation, a blocking copy)."""
        thread = self.threads.get(call.tid)
        if thread is None or call.ts_ns < thread.last_end_ns:
            return
        thread.gpu_wait_ns += max(call.end_ns - call.ts_ns, 0)
        if thread.gpu_wait_off_cpu_ns >= 0 and call.off_cpu_entry_ns >= 0 and call.off_cpu_return_ns >= call.off_cpu_entry_ns:
            thread.gpu_wait_off_cpu_ns += call.off_cpu_return_ns - call.off_cpu_entry_ns
        else:
            thread.gpu_wait_off_cpu_ns = -1

    def collective(self, call: CallEvent) -> Interval | None:
        """The thread's time since its previous collective (None: its first, or out of order)."""
        thread = self.threads.get(call.tid)
        interval = None
        if thread is not None and call.ts_ns >= thread.last_end_ns:
            duration = call.ts_ns - thread.last_end_ns
            gpu_wait = min(thread.gpu_wait_ns, duration)
            on_cpu = off_cpu = None
            if thread.last_off_cpu_ns >= 0 and call.off_cpu_entry_ns >= thread.last_off_cpu_ns and thread.gpu_wait_off_cpu_ns >= 0:
                off_total = call.off_cpu_entry_ns - thread.last_off_cpu_ns
                off_cpu = min(max(off_total - thread.gpu_wait_off_cpu_ns, 0), duration - gpu_wait)
                on_cpu = duration - gpu_wait - off_cpu
            interval = Interval(duration, gpu_wait, on_cpu, off_cpu)
        if thread is None:
            thread = self.threads[call.tid] = _Thread(call.pid, call.end_ns, call.off_cpu_return_ns)
            if len(self.threads) > MAX_THREADS:
                self.threads.popitem(last=False)
        else:
            thread.last_end_ns, thread.last_off_cpu_ns = call.end_ns, call.off_cpu_return_ns
            thread.gpu_wait_ns = thread.gpu_wait_off_cpu_ns = 0
            self.threads.move_to_end(call.tid)
        return interval

    def forget(self, pid: int) -> None:
        for tid in [tid for tid, thread in self.threads.items() if thread.pid == pid]:
            del self.threads[tid]
