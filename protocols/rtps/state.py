"""What all RTPS sessions of the agent share: discovery and sequence windows.

A sample crosses several sockets (multicast and unicast, one send per
reader), so "have we seen this one?" cannot be answered per flow.

* Sent samples are keyed by writer GUID: only the writer's process sends
  them, so a second send of the same sequence number (to another reader, or a
  reliable retransmission) is not a new message.
* Received samples are keyed by receiving process (one sample may reach it
  on its multicast and its unicast socket) and writer GUID; by flow when the
  process is not known (pcap replay, tests).
* A process that receives its own multicast back is not a reader of it: the
  participants (GUID prefixes) each process sends from are remembered.

A window remembers the highest sequence number and the holes below it. A
hole filled later (a retransmission that repairs a loss) is a new sample; a
hole still open :data:`LOSS_HORIZON` samples later, or below the writer's
first available sample (HEARTBEAT), is a lost sample; a hole the writer
declares irrelevant (GAP) is neither.

The first sample a window sees need not be the writer's first: the agent may
have started late, or the first datagrams were lost and are repaired after a
later one arrived. The :data:`LOSS_HORIZON` sequence numbers below it are
remembered as *unknown*: one arriving later is a new sample, and one that
never does is not counted as lost (the agent cannot tell a loss from a sample
sent before it looked).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Hashable

from protocols.rtps.discovery import Directory

MAX_WINDOWS = 16384
#: A process whose writers were announced this long ago, with a reader
#: elsewhere, and no sample of it crossed a socket: its data takes another way.
QUIET_NS = 5_000_000_000
MAX_WATCHED_PROCESSES = 4096
#: Holes remembered per window; a larger jump counts the excess as lost at once.
MAX_HOLES = 1024
#: A hole still open this many samples later is lost.
LOSS_HORIZON = 64


class SequenceWindow:
    __slots__ = ("highest", "holes", "lost", "first")

    def __init__(self) -> None:
        self.highest = 0
        #: Missing sequence numbers below ``highest``, ascending.
        self.holes: dict[int, None] = {}
        #: Lost samples not yet reported on a message.
        self.lost = 0
        #: The first sequence number seen; holes below it are unknown, not lost.
        self.first = 0

    def observe(self, sequence: int) -> bool:
        """Is ``sequence`` a sample not seen before? Updates holes and losses."""
        highest = self.highest
        if highest == 0:
            self.first = self.highest = sequence
            for unknown in range(max(1, sequence - LOSS_HORIZON), sequence):
                self.holes[unknown] = None
            return True
        if sequence > highest:
            if sequence > highest + 1:
                first = max(highest + 1, sequence - MAX_HOLES)
                self.lost += first - (highest + 1)
                for missing in range(first, sequence):
                    self.holes[missing] = None
            self.highest = sequence
            self._expire(sequence - LOSS_HORIZON)
            return True
        if sequence in self.holes:
            del self.holes[sequence]
            return True
        return False

    def writer_dropped_below(self, first_available: int) -> None:
        """HEARTBEAT: the writer no longer has anything below ``first_available``."""
        self._expire(first_available - 1)

    def irrelevant(self, sequences) -> None:
        """GAP: these will never be sent; not lost."""
        for sequence in sequences:
            self.holes.pop(sequence, None)

    def take_lost(self) -> int:
        lost, self.lost = self.lost, 0
        return lost

    def _expire(self, up_to: int) -> None:
        holes = self.holes
        while holes:
            oldest = next(iter(holes))
            if oldest > up_to:
                break
            del holes[oldest]
            if oldest > self.first:
                self.lost += 1


class _Watched:
    __slots__ = ("prefix", "topics", "since_ns", "samples", "reported", "shared_memory")

    def __init__(self, prefix: bytes, since_ns: int) -> None:
        self.prefix = prefix
        self.topics: set[str] = set()
        self.since_ns = since_ns
        self.samples = 0
        self.reported = False
        #: Its SPDP announced a shared-memory locator (Fast DDS): then even its SEDP
        #: may take shared memory, and only SPDP (multicast) is seen.
        self.shared_memory = False


class DataWatch:
    """Discovery seen, data not: shared-memory transports (Fast DDS's default,
    Cyclone DDS with iceoryx) move samples between processes of one host
    without a socket; only SPDP/SEDP still cross one. A process that announced
    writers (its own SEDP left its socket), whose topics have a reader in
    another participant, and that sent or received no sample over a socket
    for :data:`QUIET_NS` gets one notice, for the agent's log."""

    def __init__(self) -> None:
        self._processes: OrderedDict[int, _Watched] = OrderedDict()
        self._notices: list[str] = []
        self._next_check_ns = 0

    def announced(self, pid: int, prefix: bytes, topic: str, ts_ns: int) -> None:
        """Its SEDP announced a writer of ``topic`` through a socket."""
        self._watched(pid, prefix, ts_ns).topics.add(topic)

    def announced_shared_memory(self, pid: int, prefix: bytes, ts_ns: int) -> None:
        """Its SPDP, sent through a socket, offers a shared-memory locator."""
        self._watched(pid, prefix, ts_ns).shared_memory = True

    def _watched(self, pid: int, prefix: bytes, ts_ns: int) -> _Watched:
        watched = self._processes.get(pid)
        if watched is None:
            watched = self._processes[pid] = _Watched(prefix, ts_ns)
            if len(self._processes) > MAX_WATCHED_PROCESSES:
                self._processes.popitem(last=False)
        return watched

    def sample(self, pid: int) -> None:
        watched = self._processes.get(pid)
        if watched is not None:
            watched.samples += 1

    def check(self, ts_ns: int, directory: Directory) -> None:
        """Look for quiet processes, at most once a second of capture time."""
        if ts_ns < self._next_check_ns:
            return
        self._next_check_ns = ts_ns + 1_000_000_000
        for pid, watched in self._processes.items():
            if watched.reported or watched.samples or ts_ns - watched.since_ns < QUIET_NS:
                continue
            read_elsewhere = sorted(t for t in watched.topics if directory.has_reader_outside(t, watched.prefix))
            quiet = f"none of its samples crossed a socket in {QUIET_NS // 1_000_000_000} s"
            if read_elsewhere:
                watched.reported = True
                self._notices.append(
                    f"DDS process {pid} announced writers on {', '.join(read_elsewhere[:5])} that have readers, "
                    f"but {quiet}: its DDS is probably using shared memory (Fast DDS's default, Cyclone DDS with "
                    "iceoryx), which the agent cannot see. Configure UDP transport to trace it (docs/ros2-dds.md)."
                )
            elif watched.shared_memory and directory.shared_memory_peers(watched.prefix):
                watched.reported = True
                self._notices.append(
                    f"DDS process {pid} offers Fast DDS shared-memory transport, as do "
                    f"{directory.shared_memory_peers(watched.prefix)} other participant(s), and {quiet}: its samples "
                    "(and discovery of its topics) probably move through shared memory, which the agent cannot see. "
                    "Configure UDP transport to trace it (docs/ros2-dds.md)."
                )

    def take_notices(self) -> list[str]:
        notices, self._notices = self._notices, []
        return notices


class SharedState:
    """Discovery directory + sequence windows (bounded, oldest out first)."""

    def __init__(self) -> None:
        self.directory = Directory()
        self.data_watch = DataWatch()
        self._windows: OrderedDict[Hashable, SequenceWindow] = OrderedDict()
        #: Repeated samples (retransmissions, one send per reader) not reported as messages.
        self.repeats = 0
        self._serials = 0
        #: GUID prefix -> the process that sends as that participant (bounded).
        self._participants: OrderedDict[bytes, int] = OrderedDict()

    def note_participant(self, prefix: bytes, pid: int) -> None:
        if self._participants.get(prefix) != pid:
            self._participants[prefix] = pid
            if len(self._participants) > MAX_WATCHED_PROCESSES:
                self._participants.popitem(last=False)

    def participant_pid(self, prefix: bytes) -> int:
        return self._participants.get(prefix, 0)

    def new_session_serial(self) -> int:
        self._serials += 1
        return self._serials

    def window(self, key: Hashable, create: bool = True) -> SequenceWindow | None:
        window = self._windows.get(key)
        if window is None:
            if not create:
                return None
            window = self._windows[key] = SequenceWindow()
            if len(self._windows) > MAX_WINDOWS:
                self._windows.popitem(last=False)
        else:
            self._windows.move_to_end(key)
        return window
