"""Puts events from different CPUs back in time order before they are used.

Each CPU's records enter the ring buffer when their syscall returns, so a
server's read of a request can be submitted before the client's write of it
(the write returns a little later on another CPU). Linking a server span to
its client span needs the write first. Events are sorted by their timestamp
(when the bytes crossed) and held for a short window, so one that was
submitted late still takes its place.
"""

from __future__ import annotations

import time

from otelbpf.core.events import Event

#: How long an event may lag behind a later one in the ring buffer.
DEFAULT_WINDOW_NS = 5_000_000


def _ts(event: Event) -> int:
    return event.ts_ns


class ReorderBuffer:
    def __init__(self, window_ns: int = DEFAULT_WINDOW_NS) -> None:
        self.window_ns = window_ns
        self._held: list[Event] = []

    def __len__(self) -> int:
        return len(self._held)

    def push(self, events: list[Event], now_ns: int | None = None) -> list[Event]:
        """Add a drained batch; return the events old enough to be in order."""
        held = self._held
        held.extend(events)
        if not held:
            return []
        held.sort(key=_ts)  # nearly sorted already: Timsort makes this ~linear
        cutoff = (now_ns if now_ns is not None else time.time_ns()) - self.window_ns
        split = len(held)
        while split and held[split - 1].ts_ns > cutoff:
            split -= 1
        ready, self._held = held[:split], held[split:]
        return ready

    def holds_only(self, wanted) -> bool:
        """Whether every event held passes ``wanted`` (the agent may sleep while it holds
        nothing but on-CPU samples: holding them longer keeps them in order all the same)."""
        return all(wanted(event) for event in self._held)

    def flush(self) -> list[Event]:
        """Everything held, in order (the agent is stopping)."""
        held, self._held = sorted(self._held, key=_ts), []
        return held
