"""NCCL's own view of a job, read from its RAS port, gently.

Since 2.24 every NCCL process listens on ``localhost:28028`` (``NCCL_RAS_ADDR``) in its
network namespace, and whichever process answers reports the whole job: every
communicator (by ``commHash``), every rank's launched collective counts per function, the
ranks whose process gave no data or is considered dead (protocols/nccl/ras.py reads the
reply). :class:`RasPoller` asks it, from a thread of its own, once per ``interval_s`` (30 s
by default: NCCL's RAS has crashed under tight polling, NVIDIA/nccl#1669, #1718, #1762) in
each network namespace where a traced process maps NCCL, entering that namespace for the
connection (otelbpf/host/netns.py). JSON when the server offers it (2.28.7+), text
otherwise. From each reply:

* metrics (:meth:`RasPoller.metric_points`), under the agent's Resource, per communicator:
  ranks missing and dead, the spread of the ranks' launched counts per function; per rank
  of a traced process: its launched counts, replies read and replies in which it lagged
  (launched fewer of some function than the furthest rank) -- the rank that lags most is
  the one that enters last, whatever its kind of slowness;
* log lines: once when RAS does not answer in a namespace (NCCL older than 2.24,
  ``NCCL_RAS_ENABLE=0``, no communicator yet); when a communicator stops progressing on
  some ranks (the same lagging counts two replies running, or ranks missing), and when it
  recovers;
* the reply and the moment it was gathered (the window between the request and the end of
  the reply, on the events' clock), for the collective traces to align handles whose
  set-up the agent did not see (:meth:`RasPoller.take_replies`, applied by the pipeline,
  otelbpf/assembly.py ``attach_nccl_ras``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from otelbpf import semconv as sc
from otelbpf.host import procfs
from otelbpf.host.netns import connect_in, netns_of
from protocols.nccl import ras
from protocols.nccl.comm_hash import format_comm_hash

log = logging.getLogger("otelbpf")

DEFAULT_INTERVAL_S = 30.0
#: RAS's own gather timeout (TIMEOUT command), and how long a reply may take beyond it.
GATHER_TIMEOUT_S = 5
REPLY_TIMEOUT_S = 1 + GATHER_TIMEOUT_S + 5 + 4
CONNECT_TIMEOUT_S = 2.0
MAX_REPLY_BYTES = 64 * 1024 * 1024
#: Replies waiting for the pipeline, at most (the oldest are dropped beyond).
MAX_PENDING = 16
ERRORS = "otelbpf.nccl.ras.errors"
POLLS = "otelbpf.nccl.ras.polls"


@dataclass
class RasTarget:
    """One network namespace with traced NCCL processes: where to ask, and who is in it."""

    netns: int
    #: a process to enter the namespace through, and the pids of the traced processes in it
    pid: int
    pids: list[int]
    host: str = "localhost"
    port: int = ras.DEFAULT_PORT
    disabled: bool = False


@dataclass
class RasReply:
    """One reply, as the pipeline needs it for alignment."""

    report: ras.RasReport
    #: the events' clock (ns) when the request went out and when the reply ended
    window: tuple[int, int]
    #: traced pid -> its pid in its own pid namespace (what RAS lists)
    pids: dict[int, int]


@dataclass
class _CommState:
    """What the previous replies said of one communicator (stop detection, lag counts)."""

    #: function -> rank -> count, at the previous reply
    counts: dict[str, dict[int, int]] = field(default_factory=dict)
    #: the stall said in the log (None: progressing)
    stalled: tuple | None = None
    missing_said: frozenset = frozenset()


class RasPoller:
    """Polls NCCL's RAS in the namespaces of the traced NCCL processes (see the module)."""

    def __init__(self, nccl_pids: Callable[[], list[int]], counters=None, interval_s: float = DEFAULT_INTERVAL_S,
                 to_event_ns: Callable[[int], int] | None = None) -> None:  # fmt: skip
        #: the traced processes that map NCCL, now
        self.nccl_pids = nccl_pids
        self.counters = counters
        self.interval_s = interval_s
        self.to_event_ns = to_event_ns or (lambda monotonic_ns: monotonic_ns)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: netns -> what was said of it ("silent": no answer, once)
        self._said: dict[int, str] = {}
        #: netns -> the latest report, and its traced pids (metrics)
        self._latest: dict[int, tuple[ras.RasReport, dict[int, int]]] = {}
        self._comms: dict[int, _CommState] = {}
        #: (comm, rank) -> [replies, replies behind]
        self._lags: dict[tuple[int, int], list[int]] = {}
        self._pending: deque[RasReply] = deque(maxlen=MAX_PENDING)

    # -- the thread ------------------------------------------------------------------------

    def start(self) -> RasPoller:
        self._thread = threading.Thread(target=self._run, name="otelbpf-nccl-ras", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll_once()
            except Exception:  # noqa: BLE001 - the poller never takes the agent down
                log.exception("NCCL RAS: poll failed")

    def poll_once(self) -> list[RasReply]:
        """Ask every namespace once; the replies read (also queued for the pipeline)."""
        replies = []
        for target in self.targets():
            reply = self.ask(target)
            if reply is not None:
                replies.append(reply)
        return replies

    # -- where to ask ----------------------------------------------------------------------

    def targets(self) -> list[RasTarget]:
        by_netns: dict[int, RasTarget] = {}
        for pid in self.nccl_pids():
            netns = netns_of(pid)
            if netns is None:
                continue
            target = by_netns.get(netns)
            if target is None:
                env = procfs.environ_of(pid)
                target = by_netns[netns] = RasTarget(netns, pid, [])
                target.host, target.port = parse_address(env.get("NCCL_RAS_ADDR", ""))
                target.disabled = env.get("NCCL_RAS_ENABLE", "1").strip() == "0"
            target.pids.append(pid)
        return list(by_netns.values())

    # -- one conversation ------------------------------------------------------------------

    def ask(self, target: RasTarget) -> RasReply | None:
        if target.disabled:
            self._say_once(target, "disabled", "NCCL RAS: off in the network namespace of pid %d (NCCL_RAS_ENABLE=0): "
                           "no RAS metrics, and no alignment for an agent started after a communicator", target.pid)  # fmt: skip
            return None
        self._count(POLLS)
        try:
            sock = connect_in(target.pid, target.host, target.port, CONNECT_TIMEOUT_S)
        except OSError as exc:
            self._count(ERRORS, "no_answer")
            self._say_once(
                target, "silent", "NCCL RAS: no answer on %s:%d in the network namespace of pid %d (%s: NCCL before 2.24,"
                " RAS off, or no communicator yet); said once: no RAS metrics, and no alignment for an agent started"
                " after a communicator", target.host, target.port, target.pid, exc.strerror or exc,
            )  # fmt: skip
            return None
        try:
            data, window = converse(sock)
        except (OSError, ValueError) as exc:
            self._count(ERRORS, "conversation")
            self._say_once(target, "broken", "NCCL RAS: the conversation in the network namespace of pid %d failed: %s",
                           target.pid, exc)  # fmt: skip
            return None
        finally:
            sock.close()
        try:
            report = ras.parse_report(data)
        except ras.RasParseError as exc:
            self._count(ERRORS, "unparsable")
            self._say_once(target, "unparsable", "NCCL RAS: unreadable reply in the network namespace of pid %d: %s",
                           target.pid, exc)  # fmt: skip
            return None
        if self._said.pop(target.netns, None):
            log.info("NCCL RAS: answering in the network namespace of pid %d (NCCL %s, %s)", target.pid,
                     report.nccl_version or "?", report.format)  # fmt: skip
        pids = {pid: own_pid for pid in target.pids if (own_pid := procfs_nspid(pid)) is not None}
        reply = RasReply(report, (self.to_event_ns(window[0]), self.to_event_ns(window[1])), pids)
        with self._lock:
            self._latest[target.netns] = (report, pids)
            self._pending.append(reply)
            self._judge(report, set(pids.values()))
        return reply

    def take_replies(self, before_ns: int) -> list[RasReply]:
        """The replies whose window ended before ``before_ns`` (the events' clock): the
        pipeline has handled every call made until then."""
        with self._lock:
            out = []
            while self._pending and self._pending[0].window[1] < before_ns:
                out.append(self._pending.popleft())
            return out

    # -- what the replies say ----------------------------------------------------------------

    def _judge(self, report: ras.RasReport, local_pids: set[int]) -> None:
        """Lag counts of the local ranks; stalls and missing ranks, logged on change."""
        for communicator in report.communicators:
            state = self._comms.setdefault(communicator.comm_hash, _CommState())
            counts = communicator.counts_by_function()
            tops = {function: max(by_rank.values()) for function, by_rank in counts.items() if by_rank}
            for group in communicator.count_groups:  # text: the counts of the ranks not named
                tops[group.function] = max(tops.get(group.function, 0), group.count)
            for rank in communicator.ranks:
                if rank.pid not in local_pids or not rank.counts:
                    continue
                lag = self._lags.setdefault((communicator.comm_hash, rank.rank), [0, 0])
                lag[0] += 1
                if any(count < tops.get(function, count) for function, count in rank.counts.items()):
                    lag[1] += 1
            self._stalls(communicator, state, counts)
            state.counts = counts

    def _stalls(self, communicator: ras.RasCommunicator, state: _CommState, counts: dict[str, dict[int, int]]) -> None:
        name = format_comm_hash(communicator.comm_hash)
        stalled = []
        for function, by_rank in counts.items():
            before = state.counts.get(function, {})
            top = max(by_rank.values())
            behind = sorted(rank for rank, count in by_rank.items() if count < top and before.get(rank) == count)
            if behind:
                stalled.append((function, tuple(behind), by_rank[behind[0]], top))
        stall = tuple(stalled) or None
        if stall and stall != state.stalled:
            for function, ranks, at, top in stall:
                log.warning(
                    "NCCL RAS: communicator %s stopped progressing on rank%s %s: %s at operation %d, other ranks at %d",
                    name, "s" if len(ranks) > 1 else "", ", ".join(map(str, ranks)), function, at, top,
                )  # fmt: skip
        elif state.stalled and not stall:
            log.info("NCCL RAS: communicator %s progressing on every rank again", name)
        state.stalled = stall
        missing = frozenset((m.rank, m.host, m.pid, m.dead) for m in communicator.missing)
        if missing and missing != state.missing_said:
            log.warning(
                "NCCL RAS: communicator %s: %d of %d ranks gave no data: %s", name, len(missing), communicator.size,
                "; ".join(f"rank {r} (process {p} on node {h}{', considered dead' if d else ''})"
                          for r, h, p, d in sorted(missing)),
            )  # fmt: skip
        state.missing_said = missing

    def metric_points(self) -> list[tuple[str, str, str, str, list[tuple[dict, int]]]]:
        """(name, description, unit, kind "gauge" or "sum", [(attributes, value)]) from the
        latest replies, for the metrics exporter (read on its thread)."""
        with self._lock:
            latest = list(self._latest.values())
            lags = dict(self._lags)
        missing, dead, spread, counts = [], [], [], []
        seen: set[int] = set()
        for report, pids in latest:
            local = set(pids.values())
            for communicator in report.communicators:
                comm = format_comm_hash(communicator.comm_hash)
                if communicator.comm_hash in seen:
                    continue
                seen.add(communicator.comm_hash)
                base = {sc.OTELBPF_NCCL_COMM_HASH: comm, sc.OTELBPF_NCCL_NRANKS: communicator.size}
                missing.append((base, len(communicator.missing)))
                dead.append((base, sum(1 for m in communicator.missing if m.dead)))
                for function, width in sorted(communicator.spread().items()):
                    spread.append(({**base, sc.OTELBPF_NCCL_OPERATION: function}, width))
                for rank in communicator.ranks:
                    if rank.pid in local:
                        for function, count in sorted(rank.counts.items()):
                            counts.append(({**base, sc.OTELBPF_NCCL_RANK: rank.rank, sc.OTELBPF_NCCL_OPERATION: function}, count))
        replies = [({sc.OTELBPF_NCCL_COMM_HASH: format_comm_hash(c), sc.OTELBPF_NCCL_RANK: r}, n) for (c, r), (n, _b) in sorted(lags.items())]
        behind = [({sc.OTELBPF_NCCL_COMM_HASH: format_comm_hash(c), sc.OTELBPF_NCCL_RANK: r}, b) for (c, r), (_n, b) in sorted(lags.items())]
        return [
            (sc.OTELBPF_NCCL_RAS_RANKS_MISSING, "Ranks of the communicator that gave NCCL's RAS no data in its last gather",
             "{rank}", "gauge", missing),
            (sc.OTELBPF_NCCL_RAS_RANKS_DEAD, "Of those, ranks whose process RAS considers dead", "{rank}", "gauge", dead),
            (sc.OTELBPF_NCCL_RAS_COUNT_SPREAD, "Highest minus lowest number of collectives the communicator's ranks"
             " launched, per operation (a lasting spread: ranks stopped)", "{collective}", "gauge", spread),
            (sc.OTELBPF_NCCL_RAS_RANK_COLLECTIVES, "Collectives a rank of a traced process launched, as NCCL's RAS"
             " counts them", "{collective}", "gauge", counts),
            (sc.OTELBPF_NCCL_RAS_REPLIES, "RAS replies that reported the rank", "{reply}", "sum", replies),
            (sc.OTELBPF_NCCL_RAS_RANK_BEHIND, "RAS replies in which the rank had launched fewer collectives than the"
             " communicator's furthest rank (it enters last)", "{reply}", "sum", behind),
        ]  # fmt: skip

    def _say_once(self, target: RasTarget, what: str, message: str, *args) -> None:
        if self._said.get(target.netns) == what:
            return
        self._said[target.netns] = what
        log.warning(message, *args)

    def _count(self, name: str, label: str = "") -> None:
        if self.counters is not None:
            self.counters.add(name, label=label)


def converse(sock, gather_timeout_s: int = GATHER_TIMEOUT_S) -> tuple[bytes, tuple[int, int]]:
    """The RAS conversation on a connected socket: the reply (JSON when offered, else text),
    and the monotonic ns between sending STATUS and the reply's end (when RAS gathered)."""
    reader = _Lines(sock)
    sock.settimeout(CONNECT_TIMEOUT_S)
    sock.sendall(ras.hello())
    if ras.server_protocol(reader.line()) is None:
        raise ValueError("not a RAS server (no SERVER PROTOCOL answer)")
    sock.sendall(ras.timeout_command(gather_timeout_s))
    reader.line()  # OK (or an error: the server's default timeout then)
    sock.sendall(ras.format_command("json"))
    reader.line()  # OK, or "ERROR: Unknown command set format json" before 2.28.7: text
    sock.settimeout(REPLY_TIMEOUT_S)
    start = time.monotonic_ns()
    sock.sendall(ras.status_command(verbose=True))
    data = reader.rest()
    return data, (start, time.monotonic_ns())


class _Lines:
    """Reads a socket line by line, then to its end."""

    def __init__(self, sock) -> None:
        self.sock = sock
        self.buffer = b""

    def line(self) -> bytes:
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ValueError("connection closed mid-conversation")
            self.buffer += chunk
            if len(self.buffer) > 4096:
                raise ValueError("answer line too long")
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.rstrip(b"\r")

    def rest(self) -> bytes:
        parts = [self.buffer]
        size = len(self.buffer)
        while True:
            chunk = self.sock.recv(65536)
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)
            size += len(chunk)
            if size > MAX_REPLY_BYTES:
                raise ValueError("reply larger than 64 MiB")


def parse_address(text: str) -> tuple[str, int]:
    """``NCCL_RAS_ADDR``'s ``host:port`` (``[v6]:port``), default ``localhost:28028``."""
    text = text.strip()
    if not text:
        return "localhost", ras.DEFAULT_PORT
    host, _, port = text.rpartition(":")
    try:
        return (host.strip("[]") or "localhost"), int(port)
    except ValueError:
        return "localhost", ras.DEFAULT_PORT


def procfs_nspid(pid: int) -> int | None:
    """``pid`` as the process sees itself, in its innermost pid namespace (NSpid's last entry):
    what NCCL reports."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        return None
    return pid
