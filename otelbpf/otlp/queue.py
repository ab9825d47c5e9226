"""A bounded per-sink export queue with batching and retries, for any signal's items.

Design, and why:

* ``add`` runs on the agent's hot path, so it only appends to an open batch
  under a lock (O(1), no I/O, never raises). A full batch, or one older than
  ``schedule_delay_s``, is sealed (``make_batch(items)``) and queued for
  every sink; sinks share the batch (and so whatever it caches, e.g. its
  OTLP encoding).
* Each sink has its own worker thread and bounded queue, so a collector that
  is slow or down never delays the JSON file or the console.
* A failed export (the sink returned False) is retried after a backoff
  (``RetryPolicy``: exponential with jitter), in order; meanwhile new batches
  keep queuing. A collector that comes up late therefore loses nothing that
  fits the queue.
* The queue holds at most ``max_queue_size`` items per sink (the batch being
  retried included). Beyond that the OLDEST items are dropped and counted
  (a batch is ``len()``-sized and trimmed by ``batch.without_oldest(n)``).
  Items evicted from a batch while its export is in progress are counted
  only if that export fails: if it succeeds, they were delivered.
* Every item handed to ``add`` ends up, per sink, in exactly one of the
  ``delivered`` or ``dropped`` counters (``CounterNames``) once the queue is
  shut down; ``failures`` counts failed attempts. The counters are labelled
  with the sink name.
* ``force_flush`` and ``shutdown`` deliver what is queued within their
  timeout; shutdown then stops retrying, counts the rest as dropped and
  interrupts exports still in progress by shutting the sinks down, so it
  never hangs past its timeout (beyond the sinks' own shutdown calls).

``otelbpf.export.processor.BatchSpanProcessor`` is this queue for spans.
"""

from __future__ import annotations

import logging
import math
import os
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, TypeVar

from otelbpf.core.selfmetrics import Counters
from otelbpf.otlp.sink import Sink

_log = logging.getLogger(__name__)

Item = TypeVar("Item")


class Batch(Protocol):
    """What the queue needs of a sealed batch."""

    def __len__(self) -> int: ...

    def without_oldest(self, count: int) -> Batch: ...


@dataclass(frozen=True, slots=True)
class CounterNames:
    """The ``Counters`` names a queue counts into, per sink."""

    delivered: str
    dropped: str
    failures: str


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with jitter: ``initial_s`` doubling up to ``max_s``, each delay varied by +/- ``jitter``
    (so agents restarted together do not retry in lockstep)."""

    initial_s: float = 0.5
    max_s: float = 30.0
    jitter: float = 0.2

    def jittered(self, backoff_s: float) -> float:
        return backoff_s * random.uniform(1 - self.jitter, 1 + self.jitter)

    def next(self, backoff_s: float) -> float:
        return min(backoff_s * 2, self.max_s)


@dataclass(eq=False)
class _Lane:
    """One sink's queue and worker state. All fields are guarded by the queue lock."""

    sink: Sink[Any]
    wake: threading.Condition
    backoff_s: float
    #: Sealed batches not yet taken, oldest first, with their sequence numbers.
    queue: deque[tuple[int, Batch]] = field(default_factory=deque)
    #: The batch being exported or awaiting its retry.
    in_flight: tuple[int, Batch] | None = None
    #: Items queued or in flight, minus those already evicted.
    queued_items: int = 0
    exporting: bool = False
    #: Items of the exporting batch evicted meanwhile; dropped only if the export fails.
    evicted_while_exporting: int = 0
    #: Set by flush/shutdown: retry now instead of waiting out the backoff.
    hurry: bool = False
    #: Nothing more will be exported (drained at shutdown, or abandoned).
    finished: bool = False
    #: The sink raised from export once already (logged then; only the worker thread touches this).
    raised_before: bool = False
    thread: threading.Thread | None = None

    def oldest_sequence(self) -> float:
        if self.in_flight is not None:
            return self.in_flight[0]
        if self.queue:
            return self.queue[0][0]
        return math.inf


class BatchQueue:
    """Collects items from ``add`` and exports them in batches to each sink, each from its own queue.

    Compiled, an extension type (queue.pxd): ``add``, once per span, reads the
    queue's state as C fields and calls its steps as C methods. Items are of
    any type (``Item``); the queue never looks inside them."""

    def __init__(
        self,
        sinks: Sequence[Sink[Any]],
        counters: Counters,
        make_batch: Callable[[list[Item]], Batch],
        *,
        max_queue_size: int,
        max_batch_size: int,
        schedule_delay_s: float,
        retry: RetryPolicy | None = None,
        accept: Callable[[Item], bool] | None = None,
        counter_names: CounterNames,
        noun: str = "items",
        thread_prefix: str = "otelbpf-export",
    ) -> None:
        for name, value in (("max_queue_size", max_queue_size), ("max_batch_size", max_batch_size),
                            ("schedule_delay_s", schedule_delay_s)):  # fmt: skip
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value!r}")
        self._counters = counters
        self._make_batch = make_batch
        self._accept = accept
        self._names = counter_names
        self._noun = noun
        self._max_queue_size = int(max_queue_size)
        self._max_batch_size = min(int(max_batch_size), self._max_queue_size)
        self._schedule_delay_s = schedule_delay_s
        self._retry = retry or RetryPolicy()

        self._lock = threading.Lock()
        self._progress = threading.Condition(self._lock)  # a lane resolved (delivered/dropped) a batch
        self._open: list[Item] = []
        self._open_deadline: float | None = None
        self._next_sequence = 0
        self._closing = False
        self._shutdown_deadline = math.inf
        self._add_errors_logged = False
        self._lanes = [_Lane(sink, threading.Condition(self._lock), self._retry.initial_s) for sink in sinks]
        for lane in self._lanes:
            lane.thread = threading.Thread(target=self._run, args=(lane,), name=f"{thread_prefix}-{lane.sink.name}")
            lane.thread.daemon = True
            lane.thread.start()

    # --- hot path ------------------------------------------------------------

    def add(self, item: Item) -> None:
        """Queue an item. O(1), never blocks on I/O, never raises."""
        try:
            if self._accept is not None and not self._accept(item):
                self._count_for_every_sink(self._names.dropped, 1)
                return
            with self._lock:
                closing = self._closing
                if not closing:
                    self._add_to_open_batch(item)
            if closing:
                self._count_for_every_sink(self._names.dropped, 1)
        except Exception:  # noqa: BLE001 - the hot path must survive anything
            if not self._add_errors_logged:
                self._add_errors_logged = True
                _log.exception("dropping an item the export queue could not take (logged once)")
            self._count_for_every_sink(self._names.dropped, 1)

    def _add_to_open_batch(self, item: Item) -> None:
        self._open.append(item)
        if len(self._open) == 1:
            self._open_deadline = time.monotonic() + self._schedule_delay_s
            for lane in self._lanes:
                lane.wake.notify()  # idle workers now have a deadline to wait for
        if len(self._open) >= self._max_batch_size:
            self._seal_open_batch()

    # --- batches and queues (all under the lock) --------------------------------

    def _seal_open_batch(self) -> None:
        if not self._open:
            return
        batch = self._make_batch(self._open)
        sequence = self._next_sequence
        self._next_sequence += 1
        self._open = []
        self._open_deadline = None
        for lane in self._lanes:
            lane.queue.append((sequence, batch))
            lane.queued_items += len(batch)
            if lane.queued_items > self._max_queue_size:
                self._evict_oldest(lane, lane.queued_items - self._max_queue_size)
            lane.wake.notify()

    def _evict_oldest(self, lane: _Lane, count: int) -> None:
        dropped = 0
        while count > 0:
            taken, dropped_now = self._evict_from_in_flight(lane, count)
            if not taken:
                taken = dropped_now = self._evict_from_queue(lane, count)
            if not taken:
                break
            count -= taken
            dropped += dropped_now
            lane.queued_items -= taken
        self._counters.add(self._names.dropped, dropped, label=lane.sink.name)
        self._progress.notify_all()

    @staticmethod
    def _evict_from_in_flight(lane: _Lane, count: int) -> tuple[int, int]:
        """Evict from the batch being retried: (items taken, items dropped now)."""
        if lane.in_flight is None:
            return 0, 0
        sequence, batch = lane.in_flight
        if lane.exporting:
            taken = min(count, len(batch) - lane.evicted_while_exporting)
            lane.evicted_while_exporting += taken
            return taken, 0  # counted when the export's outcome is known
        taken = min(count, len(batch))
        lane.in_flight = (sequence, batch.without_oldest(taken)) if taken < len(batch) else None
        return taken, taken

    @staticmethod
    def _evict_from_queue(lane: _Lane, count: int) -> int:
        if not lane.queue:
            return 0
        sequence, batch = lane.queue[0]
        taken = min(count, len(batch))
        if taken == len(batch):
            lane.queue.popleft()
        else:
            lane.queue[0] = (sequence, batch.without_oldest(taken))
        return taken

    # --- worker --------------------------------------------------------------

    def _run(self, lane: _Lane) -> None:
        while True:
            batch = self._next_batch(lane)
            if batch is None:
                return
            delivered = self._export(lane, batch)
            with self._lock:
                retry = self._record_outcome(lane, batch, delivered)
            if retry:
                self._back_off(lane)

    def _next_batch(self, lane: _Lane) -> Batch | None:
        """The batch to export next; None when the worker should exit. Waits for work."""
        with self._lock:
            while True:
                if lane.finished:
                    return None
                if self._closing and time.monotonic() >= self._shutdown_deadline:
                    self._abandon(lane)
                    return None
                if lane.in_flight is None and lane.queue:
                    lane.in_flight = lane.queue.popleft()
                if lane.in_flight is not None:
                    lane.exporting = True
                    return lane.in_flight[1]
                if self._closing:  # drained: shutdown sealed the last open batch already
                    lane.finished = True
                    self._progress.notify_all()
                    return None
                self._wait_for_work(lane)

    def _wait_for_work(self, lane: _Lane) -> None:
        if self._open_deadline is None:
            lane.wake.wait()
            return
        remaining = self._open_deadline - time.monotonic()
        if remaining <= 0:
            self._seal_open_batch()
        else:
            lane.wake.wait(remaining)

    @staticmethod
    def _export(lane: _Lane, batch: Batch) -> bool:
        try:
            return lane.sink.export(batch) is True
        except Exception:  # noqa: BLE001 - sinks must not raise; if one does, it is a failed attempt
            if not lane.raised_before:
                lane.raised_before = True
                _log.exception("sink %s raised from export; retrying as a failed attempt (logged once)", lane.sink.name)
            return False

    def _record_outcome(self, lane: _Lane, batch: Batch, delivered: bool) -> bool:
        """Account for one export attempt; True when it should be retried after a backoff."""
        lane.exporting = False
        evicted, lane.evicted_while_exporting = lane.evicted_while_exporting, 0
        if lane.finished or lane.in_flight is None:  # abandoned by shutdown meanwhile: already counted
            return False
        name = lane.sink.name
        if delivered:
            self._counters.add(self._names.delivered, len(batch), label=name)
            lane.queued_items -= len(batch) - evicted
            lane.in_flight = None
            lane.backoff_s = self._retry.initial_s
            self._progress.notify_all()
            return False
        self._counters.add(self._names.failures, 1, label=name)
        if evicted:
            self._counters.add(self._names.dropped, evicted, label=name)
            sequence = lane.in_flight[0]
            lane.in_flight = (sequence, batch.without_oldest(evicted)) if evicted < len(batch) else None
            self._progress.notify_all()
        return True

    def _back_off(self, lane: _Lane) -> None:
        with self._lock:
            until = time.monotonic() + self._retry.jittered(lane.backoff_s)
            lane.backoff_s = self._retry.next(lane.backoff_s)
            while not lane.hurry and not lane.finished:
                remaining = min(until, self._shutdown_deadline) - time.monotonic()
                if remaining <= 0:
                    break
                lane.wake.wait(remaining)
            lane.hurry = False

    def _abandon(self, lane: _Lane) -> None:
        """Stop a lane at the shutdown deadline, counting everything it still holds as dropped."""
        lost = lane.queued_items + lane.evicted_while_exporting
        self._counters.add(self._names.dropped, lost, label=lane.sink.name)
        if lost:
            _log.warning("sink %s: %d %s not delivered before the shutdown timeout", lane.sink.name, lost, self._noun)
        lane.queue.clear()
        lane.in_flight = None
        lane.queued_items = lane.evicted_while_exporting = 0
        lane.finished = True
        lane.wake.notify_all()
        self._progress.notify_all()

    # --- flush and shutdown -----------------------------------------------------

    def force_flush(self, timeout_s: float = 5.0) -> bool:
        """Deliver everything queued so far; False if the timeout expired first."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._seal_open_batch()
            last_sealed = self._next_sequence - 1
            self._hurry_all_lanes()
            done = self._wait_until_resolved(last_sealed, deadline)
        for lane in self._lanes:
            _flush_sink(lane.sink)
        return done

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Deliver what is queued within ``timeout_s``, count the rest as dropped, stop the sinks."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._shutdown_deadline = time.monotonic() + timeout_s
            self._seal_open_batch()
            self._hurry_all_lanes()
        for lane in self._lanes:
            assert lane.thread is not None
            lane.thread.join(max(0.0, self._shutdown_deadline - time.monotonic()))
        with self._lock:
            for lane in self._lanes:
                if not lane.finished:  # still inside an export at the deadline
                    self._abandon(lane)
        for lane in self._lanes:
            _shutdown_sink(lane.sink)

    def _hurry_all_lanes(self) -> None:
        for lane in self._lanes:
            lane.hurry = True
            lane.wake.notify()

    def _wait_until_resolved(self, last_sequence: int, deadline: float) -> bool:
        while any(not lane.finished and lane.oldest_sequence() <= last_sequence for lane in self._lanes):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._progress.wait(remaining)
        return True

    def _count_for_every_sink(self, name: str, amount: int) -> None:
        for lane in self._lanes:
            self._counters.add(name, amount, label=lane.sink.name)


def _flush_sink(sink: Sink[Any]) -> None:
    try:
        sink.flush()
    except Exception:  # noqa: BLE001
        _log.exception("sink %s raised from flush", sink.name)


def _shutdown_sink(sink: Sink[Any]) -> None:
    try:
        sink.shutdown()
    except Exception:  # noqa: BLE001
        _log.exception("sink %s raised from shutdown", sink.name)


def setting(name: str, explicit: float | None, env_name: str, default: float, env_unit: float = 1.0) -> float:
    """The explicit value if given (must be positive), else the environment's (times ``env_unit``), else ``default``."""
    if explicit is None:
        from_env = env_number(env_name)
        return default if from_env is None else from_env * env_unit
    if not explicit > 0:
        raise ValueError(f"{name} must be positive, got {explicit!r}")
    return explicit


def env_number(name: str) -> float | None:
    """A positive number from the environment; None if unset or malformed (with a warning)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
        if value > 0 and math.isfinite(value):
            return value
    except ValueError:
        pass
    _log.warning("ignoring %s=%r: not a positive number", name, raw)
    return None
