"""The agent's main loop: drain the source on a timer, feed the pipeline,
stop cleanly on SIGINT/SIGTERM or after --duration, flushing every span."""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from typing import Protocol

from otelbpf.core.events import Event
from otelbpf.core.reorder import ReorderBuffer
from otelbpf.core.selfmetrics import Counters
from otelbpf.pipeline import Pipeline
from otelbpf.profiles.records import PROFILE_ON_CPU, StackSampleEvent

log = logging.getLogger("otelbpf")

#: How often the ring buffer is drained. Submissions do not wake us
#: (BPF_RB_NO_WAKEUP) unless we sleep on an empty ring (IDLE_AFTER_EMPTY_DRAINS),
#: so this bounds the added latency of a span and sizes the ring: peak event
#: rate x interval x record size must fit.
DRAIN_INTERVAL_S = 0.010
#: An idle tick stands this far behind the clock: past the reorder window, so
#: an event still on its way is never overtaken by a time-based end. It is
#: given only when a drain found the kernel's ring empty (the agent caught up):
#: an agent running behind (starved of CPU, or attaching a new process's
#: probes) still has older events to read, and a tick from the clock would
#: end, ahead of them, what they complete (a collective held for its ranks).
IDLE_TICK_LAG_NS = 500_000_000
IDLE_TICK_INTERVAL_S = 1.0
#: Sleeping while idle: after this many drains in a row found the ring empty
#: (~100 ms) and with nothing held for reordering, the agent sleeps until the
#: kernel submits a record (a source's ``wait_for_records``), or until its
#: next once-a-second task, instead of waking every drain interval. An agent
#: whose traced processes are quiet then costs its node ~1 wake-up a second,
#: not 100. The first record wakes it (bpf/common.h, ring_wakeup_flags); it
#: drains on its timer again until the ring stays empty. Under traffic it
#: never sleeps this way: 100 ms without a single event is no load at all.
IDLE_AFTER_EMPTY_DRAINS = 10
#: Longest of those sleeps: the periodic tasks (idle tick, kernel counters, budget) still run.
IDLE_WAIT_MAX_S = 1.0
#: On-CPU stack samples do not keep the agent awake: they come at --profile-hz on every
#: busy CPU whatever the traffic, so a drain that read nothing else counts as empty (at
#: 19 Hz they came every ~50 ms, and the agent never reached IDLE_AFTER_EMPTY_DRAINS). The
#: kernel submits them without a wake-up (bpf/profile.c); a sleep is cut short before the
#: profile ring could fill (the source's wait_for_records), and the samples read then are
#: handled in one batch, in their order among the other events. Checked only on a drain this small.
SAMPLES_ONLY_CHECK_MAX = 64


#: The kernel's cross-node context counters (EbpfSource.kernel_stats) and the self-metric each feeds.
KERNEL_CONTEXT_COUNTERS = {
    "ctx_written": "otelbpf.propagation.contexts.written",
    "ctx_read": "otelbpf.propagation.contexts.read",
    "ctx_missing": "otelbpf.propagation.contexts.stripped",
    "ctx_no_space": "otelbpf.propagation.contexts.no_space",
    "ctx_unplaced": "otelbpf.propagation.contexts.unplaced",
}


def _on_cpu_sample(event) -> bool:
    return type(event) is StackSampleEvent and event.kind == PROFILE_ON_CPU


class LiveSource(Protocol):
    def read(self) -> list[Event]: ...
    def kernel_stats(self) -> dict[str, int]: ...

    # Optional: ``wait_for_records(timeout_s, interrupt_fd) -> bool`` (see IDLE_AFTER_EMPTY_DRAINS);
    # a source without it is drained every DRAIN_INTERVAL_S, idle or not.


class Flushable(Protocol):
    def shutdown(self, timeout_s: float = ...) -> None: ...


class Agent:
    def __init__(
        self,
        source: LiveSource,
        pipeline: Pipeline,
        processor: Flushable,
        counters: Counters,
        stats_interval_s: float | None = None,
        flush_timeout_s: float = 5.0,
        budget=None,
        discard_from=None,
    ) -> None:
        self.source = source
        #: With a source here (an EbpfSource), every record is read and dropped undecoded,
        #: counted in otelbpf.events.discarded: ``--discard-events``, a benchmarking aid.
        self.discard_from = discard_from
        self.pipeline = pipeline
        self.processor = processor
        self.counters = counters
        self.stats_interval_s = stats_interval_s
        self.flush_timeout_s = flush_timeout_s
        #: otelbpf.runtime.budget.CpuBudget, or None for no CPU limit.
        self.budget = budget
        #: Set by a signal handler or another thread. A plain attribute, not a
        #: threading.Event: Event.set() from a signal handler deadlocks when the
        #: main thread is inside Event.wait() holding the same lock.
        self._stop_requested = False
        #: Written to stop a sleep on an idle ring at once (request_stop, the signal
        #: handler); -1 outside run().
        self._wake_r = self._wake_w = -1
        self.reorder = ReorderBuffer()
        self._kernel_lost_seen = 0
        self._kernel_tls_unattributed_seen = 0
        self._kernel_profile_lost_seen = 0
        #: the kernel's cross-node context counters, last seen (KERNEL_CONTEXT_COUNTERS)
        self._kernel_contexts_seen: dict[str, int] = {}

    def request_stop(self) -> None:
        self._stop_requested = True
        self._wake()

    def _wake(self) -> None:
        """End a sleep on an idle ring now (safe from a signal handler or another thread)."""
        if self._wake_w >= 0:
            try:
                os.write(self._wake_w, b"\0")
            except OSError:  # full (a wake-up is already pending) or closed as run() ends
                pass

    def _on_signal(self, signum, _frame) -> None:
        """First SIGINT/SIGTERM: stop cleanly and flush. A second one while
        flushing: leave at once (the operator has decided not to wait)."""
        if self._stop_requested:
            os.write(2, b"otelbpf: second signal, exiting without flushing\n")
            os._exit(128 + signum)
        self._stop_requested = True
        self._wake()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)

    def run(self, duration_s: float | None = None) -> None:
        wait_for_records = getattr(self.source, "wait_for_records", None)
        if wait_for_records is not None:
            self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            self._run(duration_s, wait_for_records)
        finally:
            wake_r, wake_w = self._wake_r, self._wake_w
            self._wake_r = self._wake_w = -1
            for fd in (wake_r, wake_w):
                if fd >= 0:
                    os.close(fd)

    def _run(self, duration_s: float | None, wait_for_records) -> None:
        deadline = time.monotonic() + duration_s if duration_s else None
        next_stats = time.monotonic() + self.stats_interval_s if self.stats_interval_s else None
        next_kernel_sync = next_idle_tick = time.monotonic() + 1.0
        empty_drains = 0
        while not self._stop_requested:
            tick = time.monotonic()
            drained = self._drain_once()
            empty_drains = 0 if drained else empty_drains + 1
            if self.budget is not None:
                self.budget.tick()
            now = time.monotonic()
            if now >= next_kernel_sync:
                self._sync_kernel_counters()
                for notice in self.pipeline.registry.notices():  # e.g. DDS data on shared memory
                    log.warning("otelbpf: %s", notice)
                next_kernel_sync = now + 1.0
            if now >= next_idle_tick and not drained:
                # caught up, and behind the reorder window: no event still on its way is overtaken
                self.pipeline.tick_idle(time.time_ns() - IDLE_TICK_LAG_NS)
                next_idle_tick = now + IDLE_TICK_INTERVAL_S
            if next_stats is not None and now >= next_stats:
                log.info("otelbpf: stats %s", json.dumps(self.stats()))
                next_stats = now + self.stats_interval_s
            if deadline is not None and now >= deadline:
                break
            if (
                wait_for_records is not None
                and empty_drains >= IDLE_AFTER_EMPTY_DRAINS
                and (not len(self.reorder) or self.reorder.holds_only(_on_cpu_sample))
            ):
                due = min(next_kernel_sync, next_idle_tick, now + IDLE_WAIT_MAX_S)
                for at in (next_stats, deadline):
                    if at is not None:
                        due = min(due, at)
                self._sleep_idle(wait_for_records, due - now)
                continue
            time.sleep(max(0.0, DRAIN_INTERVAL_S - (now - tick)))
        self._drain_once()
        self.pipeline.handle(self.reorder.flush())
        self._sync_kernel_counters()
        self.pipeline.finish()
        self.processor.shutdown(self.flush_timeout_s)

    def _sleep_idle(self, wait_for_records, timeout_s: float) -> None:
        """Sleep on the idle ring (IDLE_AFTER_EMPTY_DRAINS) until a record, a stop or ``timeout_s``."""
        if timeout_s > 0 and not self._stop_requested:
            self.counters.add("otelbpf.agent.idle_sleeps")
            wait_for_records(timeout_s, self._wake_r)
        try:
            while os.read(self._wake_r, 64):
                pass
        except OSError:  # BlockingIOError: nothing (more) to read
            pass

    def _drain_once(self) -> int:
        """Read what the kernel submitted and handle what is in order; returns
        how many events were read (0: the ring was empty, the agent caught up, or
        it held on-CPU samples only: SAMPLES_ONLY_CHECK_MAX)."""
        if self.discard_from is not None:
            dropped = self.discard_from.discard()
            if dropped:
                self.counters.add("otelbpf.events.discarded", dropped)
            return dropped
        events = self.source.read()
        ready = self.reorder.push(events)
        if ready:
            self.pipeline.handle(ready)
        count = len(events)
        if count <= SAMPLES_ONLY_CHECK_MAX and all(map(_on_cpu_sample, events)):
            return 0  # nothing but on-CPU samples (SAMPLES_ONLY_CHECK_MAX)
        return count

    def _sync_kernel_counters(self) -> None:
        try:
            kernel = self.source.kernel_stats()
        except Exception as exc:  # the maps are gone if BCC is tearing down
            log.debug("kernel stats unavailable: %s", exc)
            return
        lost = kernel.get("lost", 0)
        if lost > self._kernel_lost_seen:
            self.counters.add("otelbpf.events.lost", lost - self._kernel_lost_seen)
            self._kernel_lost_seen = lost
        profile_lost = kernel.get("profile_lost", 0)  # stack samples the profile ring had no room for
        if profile_lost > self._kernel_profile_lost_seen:
            self.counters.add("otelbpf.profiles.lost", profile_lost - self._kernel_profile_lost_seen)
            self._kernel_profile_lost_seen = profile_lost
        unattributed = kernel.get("tls_unattributed", 0)  # TLS plaintext with no connection to put it on
        if unattributed > self._kernel_tls_unattributed_seen:
            self.counters.add("otelbpf.tls.unattributed", unattributed - self._kernel_tls_unattributed_seen)
            self._kernel_tls_unattributed_seen = unattributed
        for name, counter in KERNEL_CONTEXT_COUNTERS.items():  # cross-node propagation (bpf/propagate.c)
            value = kernel.get(name, 0)
            seen = self._kernel_contexts_seen.get(name, 0)
            if value > seen:
                self.counters.add(counter, value - seen)
                self._kernel_contexts_seen[name] = value

    def stats(self) -> dict[str, int]:
        out = self.counters.as_dict()
        out["otelbpf.connections.open"] = len(self.pipeline.table)
        if self.budget is not None:
            out["otelbpf.budget.shed_permille"] = self.pipeline.table.shed_permille
        return out
