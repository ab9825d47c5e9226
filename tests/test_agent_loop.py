"""The agent's drain loop on its own (no kernel): when it lets time-based ends
happen on the wall clock."""

from __future__ import annotations

import time

from otelbpf.agent import IDLE_TICK_LAG_NS, Agent
from otelbpf.events import ProcessExit
from otelbpf.selfmetrics import Counters


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
