"""The agent's drain loop on its own (no kernel): when it lets time-based ends
happen on the wall clock."""

from __future__ import annotations

import select
import threading
import time

from otelbpf.core.events import ProcessExit
from otelbpf.core.selfmetrics import Counters
from otelbpf.profiles.records import PROFILE_OFF_CPU, PROFILE_ON_CPU, StackSampleEvent
from otelbpf.runtime.agent import IDLE_AFTER_EMPTY_DRAINS, IDLE_TICK_LAG_NS, IDLE_WAIT_MAX_S, Agent


class BacklogSource:
    """A kernel ring with a backlog: every read returns events until ``busy_s`` has passed."""

    def __init__(self, busy_s: float) -> None:
        self.until = time.monotonic() + busy_s
        self.reads_with_events = 0

    def read(self):
        if time.monotonic() < self.until:
            self.reads_with_events += 1
            return [ProcessExit(ts_ns=time.time_ns() - 5_000_000_000, pid=4242)]
        return []

    def kernel_stats(self):
        return {}


class RecordingPipeline:
    def __init__(self, source: BacklogSource) -> None:
        self.source = source
        self.ticks: list[tuple[float, int]] = []  # (monotonic when, the tick's events-clock time)
        self.registry = type("Registry", (), {"notices": staticmethod(lambda: [])})()

    def handle(self, events) -> None:
        pass

    def tick_idle(self, now_ns: int) -> None:
        self.ticks.append((time.monotonic(), now_ns))

    def finish(self, ts_ns=None) -> None:
        pass


class NullProcessor:
    def shutdown(self, timeout_s: float = 5.0) -> None:
        pass


def test_no_wall_clock_tick_while_the_agent_is_behind_the_kernel():
    """Events 5 s old keep arriving for 1.6 s (an agent running behind): a tick from the
    wall clock then would end what those events complete. It comes once the ring is empty."""
    source = BacklogSource(busy_s=1.6)
    pipeline = RecordingPipeline(source)
    started = time.monotonic()
    Agent(source, pipeline, NullProcessor(), Counters()).run(duration_s=2.8)
    assert source.reads_with_events > 10
    assert pipeline.ticks, "an idle agent must still tick"
    first_when, first_now = pipeline.ticks[0]
    assert first_when >= source.until, f"ticked {source.until - first_when:.2f}s before catching up"
    assert first_when - started < 2.8
    assert first_now <= time.time_ns() - IDLE_TICK_LAG_NS


class QuietSource:
    """A kernel ring with nothing in it, that can sleep until woken (EbpfSource.wait_for_records).

    Its wait blocks on the agent's interrupt fd only, ignoring the timeout up to ``block_s``,
    so a test can tell an interrupted sleep from one that timed out."""

    def __init__(self, block_s: float | None = None) -> None:
        self.reads = 0
        self.waits: list[tuple[int, float, int]] = []  # (reads before it, timeout asked, interrupt fd)
        self.block_s = block_s

    def read(self):
        self.reads += 1
        return []

    def kernel_stats(self):
        return {}

    def wait_for_records(self, timeout_s: float, interrupt_fd: int) -> bool:
        self.waits.append((self.reads, timeout_s, interrupt_fd))
        select.select([interrupt_fd], [], [], self.block_s if self.block_s is not None else timeout_s)
        return False


def test_an_idle_agent_sleeps_on_the_ring_instead_of_draining_every_interval():
    """Ten empty drains in a row (~100 ms), then it waits for the kernel's next record,
    a second at most (its once-a-second tasks), never past its deadline."""
    source = QuietSource()
    pipeline = RecordingPipeline(source)
    counters = Counters()
    Agent(source, pipeline, NullProcessor(), counters).run(duration_s=2.5)
    assert source.waits, "an idle agent must sleep on the ring"
    assert source.waits[0][0] == IDLE_AFTER_EMPTY_DRAINS, source.waits[:3]
    assert all(0 < timeout <= IDLE_WAIT_MAX_S for _, timeout, _ in source.waits), source.waits
    assert all(fd >= 0 for _, _, fd in source.waits)
    # 2.5 s on a 10 ms timer would be ~250 drains; sleeping, a handful a second
    assert source.reads < 60, source.reads
    assert counters.get("otelbpf.agent.idle_sleeps") == len(source.waits)
    assert pipeline.ticks, "the once-a-second idle tick still runs"


def test_a_stop_request_ends_the_idle_sleep_at_once():
    """request_stop (as from the signal handler) wakes a sleep that would otherwise last 30 s."""
    source = QuietSource(block_s=30.0)
    agent = Agent(source, RecordingPipeline(source), NullProcessor(), Counters())
    threading.Timer(0.5, agent.request_stop).start()
    started = time.monotonic()
    agent.run()
    assert source.waits, "the agent never slept"
    assert time.monotonic() - started < 10.0


def test_a_busy_agent_never_sleeps_on_the_ring():
    """Events in every drain: it stays on its drain timer (a wake-up per record is what
    BPF_RB_NO_WAKEUP avoids, docs/architecture.md)."""

    class BusySource(BacklogSource):
        waits = 0

        def wait_for_records(self, timeout_s, interrupt_fd):
            BusySource.waits += 1
            return False

    source = BusySource(busy_s=5.0)
    Agent(source, RecordingPipeline(source), NullProcessor(), Counters()).run(duration_s=1.0)
    assert source.reads_with_events > 20
    assert BusySource.waits == 0


class SamplingSource(QuietSource):
    """A ring that only ever carries one stack sample per drain (a busy process profiled
    while nothing else happens), of ``kind``."""

    def __init__(self, kind: int) -> None:
        super().__init__()
        self.kind = kind
        self.sent: list[int] = []

    def read(self):
        self.reads += 1
        ts = time.time_ns() - 1_000_000  # inside the reorder window: held at first
        self.sent.append(ts)
        return [StackSampleEvent(ts, 4242, 4242, 0, self.kind, 0, "spin", -1, b"", 0, b"", b"")]


class HandledPipeline(RecordingPipeline):
    def __init__(self, source) -> None:
        super().__init__(source)
        self.handled: list[int] = []

    def handle(self, events) -> None:
        self.handled.extend(event.ts_ns for event in events)


def test_on_cpu_samples_alone_do_not_keep_the_agent_awake():
    """Samples come at --profile-hz whatever the traffic: drains that read only on-CPU
    samples count as empty, so the agent sleeps (the kernel does not wake it for them), even
    with samples held in the reorder window; every sample is still handled, in order."""
    source = SamplingSource(PROFILE_ON_CPU)
    pipeline = HandledPipeline(source)
    Agent(source, pipeline, NullProcessor(), Counters()).run(duration_s=1.5)
    assert source.waits, "the agent never slept while only samples came"
    assert source.waits[0][0] == IDLE_AFTER_EMPTY_DRAINS, source.waits[:3]
    assert source.reads < 60, source.reads
    assert pipeline.handled == source.sent  # none lost or reordered, the last ones at the stop
    assert pipeline.ticks, "samples-only drains let the idle tick run"


def test_off_cpu_samples_keep_the_agent_on_its_drain_timer():
    """Off-CPU samples come at every block, not at a rate: they are events like the others."""
    source = SamplingSource(PROFILE_OFF_CPU)
    pipeline = HandledPipeline(source)
    Agent(source, pipeline, NullProcessor(), Counters()).run(duration_s=1.0)
    assert source.waits == []
    assert source.reads > 40, source.reads
    assert pipeline.handled == source.sent
